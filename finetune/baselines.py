"""What a model that learned nothing from its inputs scores, and whether a run's predictions are
one constant: a score at or below its baseline, or constant predictions, mean the run did not
learn the task (too few steps, too low a rate, a collapsed head) whatever the number looks like.

Baselines per family, each scored with the task's own metric functions on the same dev split:

- classification (GLUE, a task file's classification): the training set's majority class for
  every dev example (accuracy = its dev share; F1 of class 1 is 0 unless class 1 is the
  majority; MCC 0);
- regression (STS-B): the training mean for every example (correlations 0);
- multiple choice: chance, one of the choices at random (accuracy 1 / choices);
- NER: no entity anywhere (every word `O`: entity F1 0);
- SQuAD: no answer to any question (v1.1: EM and F1 0; v2.0: EM = F1 = the share of
  unanswerable questions).
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Baseline:
    """The scores of predictions that ignore the input, on one task's dev splits."""

    kind: str
    """What the baseline predicts: "majority class 1", "training mean 2.70", "chance (1 of 4)",
    "no entities", "no answer"."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The task's dev metrics (names as the run's) of the baseline, as fractions."""
    score: float = 0.0
    """The baseline's score, computed as the run's `score` is."""


def merge(baselines: Mapping[str, tuple[Baseline | None, bool]]) -> Baseline | None:
    """One task's baseline from its splits' (baseline, selects): metrics side by side, the
    score the mean over the splits that select (as `finetune.loop.merge_scored` scores a run);
    None when a split has none."""
    if not baselines or any(b is None for b, _ in baselines.values()):
        return None
    metrics = {name: value for b, _ in baselines.values() for name, value in b.metrics.items()}
    first = next(iter(baselines.values()))[0]
    score = statistics.fmean(b.score for b, selects in baselines.values() if selects)
    return Baseline(first.kind, metrics, score)


def constant_text(values, describe=str) -> str:
    """`describe(value)` of the one value every prediction has ("1", "O"), or "" when they
    differ (or there are none)."""
    distinct = set(values)
    return describe(next(iter(distinct))) if len(distinct) == 1 else ""


def learned(score: float, baseline: Baseline | None) -> bool | None:
    """Whether `score` beats the baseline (None without one)."""
    return None if baseline is None else score > baseline.score + 1e-9


def note(task: str, score: float, baseline: Baseline | None, constant: str,
         constant_runs: int = 0, runs: int = 1) -> str:
    """The report's warning line for a task that did not learn, else "":
    "MRPC: predictions are constant (all 1); score 68.38 = majority class 1 baseline 68.38".

    A task whose best run learned a little while most runs at the chosen rate predicted a
    constant gets the line too: its score is one lucky seed, not a recipe that learns."""
    mostly_constant = runs > 1 and 2 * constant_runs > runs
    if baseline is None or (not constant and learned(score, baseline) and not mostly_constant):
        return ""
    seeds = f"{constant_runs} of {runs} runs at the chosen rate predicted a constant"
    if constant:
        where = f"{task}: predictions are constant ({constant})"
    elif not learned(score, baseline):
        where = f"{task}: score {100 * score:.2f} is not above the baseline"
    else:
        return (f"{task}: {seeds}; score {100 * score:.2f} vs {baseline.kind} baseline "
                f"{100 * baseline.score:.2f}: most runs did not learn the task (see "
                "docs/finetuning.md, 'Small tasks and a task that learns nothing')")
    seeds = f"; {seeds}" if constant_runs and runs > 1 else ""
    return (f"{where}; score {100 * score:.2f} vs {baseline.kind} baseline "
            f"{100 * baseline.score:.2f}{seeds}: the run did not learn the task (see "
            "docs/finetuning.md, 'Small tasks and a task that learns nothing')")
