"""The contract between the one fine-tuning loop and a task family.

A family (GLUE classification, SQuAD spans, multiple choice, NER tokens) is data and pure
functions: how to read and encode its splits, which head sits on the encoder, how a batch is
laid out, its loss, and how raw outputs become the paper's metrics and the official prediction
files. The loop (`finetune.loop`) owns everything else once: optimizer and schedule, seeds,
devices and autocast, the learning-rate x seed grid, choosing the best run, progress.

Units: the loop batches *units* of an encoded split: a GLUE/NER example, a multiple-choice
example (all its choices), a SQuAD window (one question x one passage span). `batch_size` in a
recipe counts units, as the paper's recipes do.

A family's split of one file is an `ExampleSplit` (its examples, the records set aside, a fixed
random `subset`) plus where it came from.

Metrics are fractions in [0, 1] everywhere (the report prints them x100), keyed by the names the
paper reports: "accuracy", "f1", "exact", "mcc", "HasAns_f1", ...
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Self, TypeVar, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

from common.errors import BadRecord
from common.settings import check
from finetune.baselines import Baseline
from model.bert import BertModel

PAPER_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)


@dataclass(frozen=True)
class Recipe:
    """A family's fine-tuning defaults, as the paper gives them (section 4 / appendix A.3); a
    field a family leaves out keeps the paper's GLUE value."""

    max_seq_length: int = 128
    """Tokens per sequence (SQuAD: per window)."""
    batch_size: int = 32
    """Units per optimizer step."""
    epochs: float = 3.0
    """Passes over the training units."""
    learning_rates: tuple[float, ...] = PAPER_LEARNING_RATES
    """Peak learning rates tried; the best mean dev score is kept."""

    def __post_init__(self) -> None:
        check_recipe(self)


def check_recipe(values: Any, unset_allowed: bool = False) -> None:
    """The checks of the `Recipe` fields of `values`; with `unset_allowed`, an unset one (None,
    or () for the rates: the family's value) passes."""
    def given(name: str) -> bool:
        return not (unset_allowed and getattr(values, name) in (None, ()))

    if given("max_seq_length"):
        check(2 <= values.max_seq_length <= 512, "max_seq_length",
              f"must be in 2..512, got {values.max_seq_length}")
    if given("batch_size"):
        check(values.batch_size >= 1, "batch_size", f"must be >= 1, got {values.batch_size}")
    if given("epochs"):
        check(values.epochs > 0, "epochs", f"must be > 0, got {values.epochs}")
    if given("learning_rates"):
        check(bool(values.learning_rates) and all(lr > 0 for lr in values.learning_rates),
              "learning_rates", f"must be positive, got {values.learning_rates}")


Batch = Any
"""Tensors of one batch: the family's own frozen dataclass, made on the host (`to_device` moves
its tensor fields)."""

BatchT = TypeVar("BatchT")


def to_device(batch: BatchT, device: torch.device) -> BatchT:
    """`batch` (a dataclass) with its host tensors on `device`; itself when none has to move.

    To a GPU they go through page-locked memory without waiting: a copy from pageable memory
    waits until the device has run all the work queued before it, so the host could not queue
    the next step while the device runs this one.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return batch
    pinned = device.type == "cuda"
    moved = {f.name: (value.pin_memory() if pinned else value).to(device, non_blocking=pinned)
             for f in dataclasses.fields(batch)
             if isinstance(value := getattr(batch, f.name), Tensor) and value.device.type == "cpu"}
    return dataclasses.replace(batch, **moved) if moved else batch


@runtime_checkable
class Encoded(Protocol):
    """A split made model-ready, as units the loop indexes."""

    def __len__(self) -> int:
        """Number of units."""

    @property
    def lengths(self) -> np.ndarray:
        """(N,) tokens of each unit; evaluation batches units of similar length together."""


ExampleT = TypeVar("ExampleT")


@dataclass(frozen=True, kw_only=True)
class ExampleSplit(Generic[ExampleT]):
    """The examples read from one file and the records set aside from it (a family's split
    adds where it came from: task, split, path, version)."""

    examples: list[ExampleT]
    bad_records: list[BadRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, limit: int | None, seed: int = 0) -> Self:
        """A fixed random subset of `limit` examples, in file order (all when limit is None)."""
        if limit is None or limit >= len(self.examples):
            return self
        keep = np.sort(np.random.default_rng(seed).choice(len(self.examples), limit,
                                                          replace=False))
        return dataclasses.replace(self, examples=[self.examples[i] for i in keep])


@dataclass(frozen=True)
class Prepared:
    """One task's splits, read and encoded once for all of its runs."""

    task: str
    """Task name, e.g. "squad1", "conll2003", "rte"."""
    train: Encoded
    """Training units."""
    dev: Mapping[str, Encoded]
    """Evaluation splits by name ("dev"; MNLI: "dev_matched", "dev_mismatched")."""
    num_train_examples: int
    """Examples read for training (SQuAD: questions, not windows)."""
    num_dev_examples: Mapping[str, int]
    """Examples read per evaluation split."""
    bad_records: tuple[BadRecord, ...] = ()
    """Records set aside while reading (counted in the report, written to dead_letter.jsonl)."""
    context: Any = None
    """What `score` needs besides raw outputs (SQuAD: the examples and window maps)."""


@dataclass(frozen=True)
class Scored:
    """One evaluation split scored."""

    metrics: dict[str, float]
    """The paper's metrics for this split, as fractions."""
    score: float
    """The one number that picks the best learning rate (GLUE: the task score; SQuAD: F1;
    multiple choice: accuracy; NER: entity F1)."""
    files: dict[str, str] = field(default_factory=dict)
    """Files to write under `<output>/<task>/`, name -> text (SQuAD: predictions.json,
    null_odds.json; `PARTIAL_FILE` where the split was sliced)."""
    selects: bool = True
    """Whether `score` takes part in picking the rate; False for a labelled test split
    reported beside dev (CoNLL-2003's test F1, the paper's number), never tuned on."""
    baseline: Baseline | None = None
    """What predictions that ignore the input score on this split (`finetune.baselines`)."""
    constant: str = ""
    """The one prediction every unit got ("all 1", "all O", "no answer"), or "" when they
    differ: a run whose predictions are constant learned nothing."""


@dataclass(frozen=True)
class EvalTexts:
    """The texts of one evaluation split: what the contamination audit looks for in the
    pre-training corpus (finetune/eval_sets.py lists each family's splits and fields)."""

    task: str
    split: str
    """"dev", "test", "dev_matched", ..."""
    files: tuple[str, ...]
    """The files read (the audit's manifest hashes them)."""
    examples: tuple[tuple[str, tuple[str, ...]], ...]
    """(example id, text fields) of every example, in file order."""

    @classmethod
    def of(cls, task: str, split: str, files: Iterable[str],
           examples: Iterable[tuple[str, tuple[str, ...]]]) -> EvalTexts:
        return cls(task, split, tuple(files), tuple(examples))


PARTIAL_FILE = "PARTIAL.txt"
"""A `Scored.files` entry of a sliced split's predictions: one line saying they are partial
("partial (N of M questions): not for submission"); the report marks the task's row with it."""


class Family(Protocol):
    """What the loop needs from a task family. One module-level instance per family."""

    name: str
    """"glue", "squad", "multiple_choice", "ner"."""

    def recipe(self, task: str) -> Recipe:
        """The paper's recipe for `task` (SQuAD v2.0 differs from v1.1)."""

    def check_files(self, task: str, data_dir: str) -> None:
        """Raise FileNotFoundError naming the missing file before any training starts."""

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        """Read and encode the task's splits (subsets drawn with a fixed seed)."""

    def build_head(self, encoder: BertModel, task: str) -> nn.Module:
        """A fresh task model over a copy of `encoder` (the loop seeds the draw)."""

    def make_batch(self, encoded: Encoded, indices: Sequence[int], max_seq_length: int,
                   train: bool, row_length: int | None = None) -> Batch:
        """The units at `indices` as one batch, packed where the family allows it into rows of
        `row_length` tokens (None: max_seq_length); per-unit outputs keep max_seq_length."""

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """Forward and the scalar training loss (computed in float32)."""

    def outputs(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        """Forward without loss: per-unit raw outputs (logits), in the batch's unit order."""

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        """Metrics and prediction files from the raw outputs of every unit of `split`, in
        unit order (the loop concatenates `outputs` over batches and restores the order)."""

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """The texts of every split the task is scored or predicted on (dev, and test where
        present), for the contamination audit; a file its reader refuses raises the reader's
        one-line error (file and line)."""


__all__ = ["Batch", "Encoded", "EvalTexts", "Family", "Prepared", "Recipe", "Scored"]
