"""The evaluation sets' n-gram index: which examples hold each n-gram hash.

Built once on the launcher from every evaluation example (`build`), saved as one `.npz` file
(`save`: two parallel arrays sorted by hash, and the examples' keys as JSON) that each worker
loads in `DoFn.setup` (`load`), so the corpus streams past it and no worker holds more than the
evaluation sets' n-grams (tens of MB for GLUE + SQuAD + SWAG + CoNLL). `lookup` finds a
passage's n-grams with two binary searches per distinct n-gram.
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common import storage
from pipelines.contamination import ngrams


@dataclass(frozen=True)
class ExampleKey:
    """One evaluation example: its task, split and id in that split's file."""

    task: str
    split: str
    example_id: str


@dataclass(frozen=True)
class EvalIndex:
    """n-gram hash -> examples holding it, as rows sorted by hash."""

    n: int
    """Words per n-gram."""
    hashes: np.ndarray
    """(R,) uint64, sorted: one row per (n-gram, example holding it)."""
    example_rows: np.ndarray
    """(R,) int32: the example of each row, an index into `examples`."""
    examples: tuple[ExampleKey, ...]
    """Every example read, in reading order (also those without any n-gram)."""
    ngram_counts: np.ndarray
    """(E,) int64: distinct n-grams of each example (0: every field shorter than n words)."""

    def lookup(self, passage: np.ndarray) -> Match:
        """The examples and n-grams a passage shares with the index; `passage`: its n-gram
        hashes ((P,) uint64, in text order)."""
        if not len(passage) or not len(self.hashes):
            return Match({}, np.zeros(0, dtype=np.uint64))
        left = np.searchsorted(self.hashes, passage, "left")
        right = np.searchsorted(self.hashes, passage, "right")
        hits = np.flatnonzero(right > left)
        found: dict[int, int] = {}
        for position in hits:
            for row in range(left[position], right[position]):
                found.setdefault(int(self.example_rows[row]), int(position))
        return Match(found, np.unique(passage[hits]))


@dataclass(frozen=True)
class Match:
    """What one passage shares with the evaluation sets."""

    examples: dict[int, int]
    """{example index: position in the passage of the first n-gram they share}."""
    ngrams: np.ndarray
    """(M,) uint64: the distinct shared n-gram hashes, sorted."""


def build(examples: Sequence[tuple[ExampleKey, Sequence[str]]], n: int) -> EvalIndex:
    """The index of (example, its text fields) pairs at n-gram size `n`."""
    per_example = [ngrams.text_ngrams(texts, n) for _, texts in examples]
    counts = np.array([len(h) for h in per_example], dtype=np.int64)
    hashes = (np.concatenate(per_example) if per_example else np.zeros(0, dtype=np.uint64))
    rows = np.repeat(np.arange(len(per_example), dtype=np.int32), counts)
    order = np.argsort(hashes, kind="stable")
    return EvalIndex(n, hashes[order], rows[order], tuple(key for key, _ in examples), counts)


def task_ngrams(index: EvalIndex, task: str, split: str | None = None) -> np.ndarray:
    """The distinct n-gram hashes of a task's examples (of one split when given), sorted."""
    wanted = np.array([k.task == task and (split is None or k.split == split)
                       for k in index.examples], dtype=bool)
    if not len(wanted):
        return np.zeros(0, dtype=np.uint64)
    return np.unique(index.hashes[wanted[index.example_rows]])


def save(index: EvalIndex, path: str) -> None:
    """Write `index` to `path` (.npz) atomically."""
    keys = json.dumps([[k.task, k.split, k.example_id] for k in index.examples])
    buffer = io.BytesIO()
    np.savez(buffer, n=np.int64(index.n), hashes=index.hashes, example_rows=index.example_rows,
             ngram_counts=index.ngram_counts, examples=np.frombuffer(keys.encode(), np.uint8))
    storage.atomic_write_bytes(path, buffer.getvalue())


def load(path: str) -> EvalIndex:
    """The index `save` wrote to `path`."""
    with storage.open_read(path, "rb") as f:
        data = np.load(io.BytesIO(f.read()))
        keys = json.loads(data["examples"].tobytes().decode())
        return EvalIndex(int(data["n"]), data["hashes"], data["example_rows"],
                         tuple(ExampleKey(*k) for k in keys), data["ngram_counts"])
