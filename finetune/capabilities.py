"""Optional family capabilities, used by the loop when a family has them: `SizedTasks` (which
tasks are small: every seed runs on those, `seeds_for`), `TestSets` (unlabelled test splits
predicted for a leaderboard: GLUE, SWAG), `ModelChecks` (the family's own demands on the
encoder, checked before any training) and `Summaries` (what the report gives over the family's
tasks of a run together: GLUE's score and leaderboard zip)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from finetune.family import Encoded, Family, Prepared
from finetune.options import FinetuneConfig
from finetune.results import TaskResult, TestPredictions
from model.bert import BertModel


@runtime_checkable
class SizedTasks(Protocol):
    """A family whose small tasks run every seed and large ones the first (GLUE: CoLA, MRPC,
    STS-B, RTE, WNLI are small). Families without it run every seed given."""

    def is_small(self, task: str) -> bool:
        """Whether `task`'s dev set is small enough that seeds are averaged."""


@runtime_checkable
class TestSets(Protocol):
    """A family with unlabelled test splits to predict with the best run (GLUE, SWAG)."""

    def test_splits(self, prepared: Prepared) -> Mapping[str, Encoded]:
        """The test splits read for `prepared`'s task, by name (empty when none)."""

    def test_predictions(self, prepared: Prepared, split: str,
                         outputs: dict[str, np.ndarray]) -> TestPredictions:
        """The leaderboard file of `split` from the raw outputs of its units, in unit order."""


@runtime_checkable
class ModelChecks(Protocol):
    """A family with its own demands on the encoder, checked before any training (GLUE:
    sentence pairs need two token types)."""

    def check_model(self, encoder: BertModel, task: str, model_dir: str) -> None:
        """Raise ValueError naming the task and the model when `encoder` cannot serve it."""


@dataclass(frozen=True)
class FamilySummary:
    """One family's line over its tasks of a run (GLUE: the GLUE score)."""

    key: str
    """Its name in results.json ("glue_score")."""
    label: str
    """Its name in the table's row and the plot's title ("GLUE score")."""
    score: float
    """A fraction, as a task's score."""
    leaderboard_files: tuple[str, ...] = ()
    """Every file the family's leaderboard wants, in its order (GLUE's SUBMISSION_FILES): those
    predicted go into `submission.zip`, the others are listed as missing in results.json."""


@runtime_checkable
class Summaries(Protocol):
    """A family whose tasks of a run are also reported together (GLUE: the GLUE score and the
    leaderboard zip). The report asks each family of the run's tasks that has it."""

    def summary(self, tasks: Sequence[TaskResult]) -> FamilySummary:
        """The summary of `tasks` (the family's tasks of the run, at least one)."""


def seeds_for(family: Family, task: str, cfg: FinetuneConfig) -> tuple[int, ...]:
    """Every seed for a small task (or a family that does not say), the first for others."""
    if isinstance(family, SizedTasks) and not family.is_small(task):
        return cfg.seeds[:1]
    return cfg.seeds
