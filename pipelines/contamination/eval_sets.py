"""The evaluation splits an audit is handed, and their examples keyed for the index.

The audit reads no evaluation file itself: its caller hands it the splits (flows/
audit_contamination.py, from each fine-tuning family's `eval_texts`), so the Beam job knows
no task, family or file format. A split is anything of `EvalSplit`'s shape
(`finetune.family.EvalTexts` is one).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from pipelines.contamination.index import ExampleKey


class EvalSplit(Protocol):
    """One evaluation split: where it was read from and its examples' text fields."""

    task: str
    split: str
    files: Sequence[str]
    """The files read (their hashes address the audit's output)."""
    examples: Sequence[tuple[str, tuple[str, ...]]]
    """(example id, text fields) of every example."""


def keyed_examples(splits: Iterable[EvalSplit]) -> list[tuple[ExampleKey, tuple[str, ...]]]:
    """Every example of `splits` under its (task, split, example id) key, as the index takes
    them."""
    return [(ExampleKey(s.task, s.split, example_id), texts)
            for s in splits for example_id, texts in s.examples]
