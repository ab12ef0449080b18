"""The evaluation splits an audit is handed: each example's key and text fields.

The audit reads no evaluation file itself: its caller hands it the splits (flows/
audit_contamination.py, from each fine-tuning family's `eval_texts`), so the Beam job knows
no task, family or file format.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipelines.contamination.index import ExampleKey


@dataclass(frozen=True)
class EvalSplit:
    """One evaluation split: where it was read from and its examples' text fields."""

    task: str
    split: str
    files: tuple[str, ...]
    """The files read (their hashes address the audit's output)."""
    examples: tuple[tuple[ExampleKey, tuple[str, ...]], ...]


def eval_split(task: str, split: str, files: Sequence[str],
               examples: Iterable[tuple[str, tuple[str, ...]]]) -> EvalSplit:
    """An `EvalSplit` of (example id, text fields) pairs."""
    return EvalSplit(task, split, tuple(files), tuple(
        (ExampleKey(task, split, example_id), texts) for example_id, texts in examples))
