"""Packed batches for every fine-tuning family: several sequences share one row of tokens.

The bin packing is pre-training's (`common.bin_packing.pack_lengths`, best-fit decreasing);
`lay_out` writes the sequences into the rows and says where each one landed. The encoder's
per-instance attention (`sequence_ids`: which sequence of its row a token belongs to, -1 for
padding) keeps each sequence on its own, so outputs are those of one sequence per padded row,
without the pad tokens' work. GLUE, multiple choice, NER and SQuAD build their batches from
this one layout.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common import bin_packing


def pack_rows(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """Positions into `lengths` grouped into rows of <= row_length tokens (best-fit
    decreasing), rows in the order their longest sequence comes in the longest-first order,
    each row's sequences longest first (equal lengths in input order)."""
    for n in lengths:
        if n > row_length:
            raise ValueError(f"example of {n} tokens exceeds the row length {row_length}")
    rows = bin_packing.pack_lengths(lengths, row_length)
    # Longest first, ties by position: the order sequences are placed in.
    rank = {i: r for r, i in enumerate(sorted(range(len(lengths)), key=lambda i: -lengths[i]))}
    rows = [sorted(row, key=rank.__getitem__) for row in rows]
    return sorted(rows, key=lambda row: rank[row[0]])


def one_per_row(count: int) -> list[list[int]]:
    """The unpacked layout: sequence j alone in row j."""
    return [[j] for j in range(count)]


@dataclass(frozen=True)
class RowLayout:
    """N sequences written into R rows of T tokens, at most K per row."""

    input_ids: np.ndarray
    """(R, T) int64 token ids, 0 after a row's last sequence."""
    token_type_ids: np.ndarray
    """(R, T) int64 segment ids (0 where none were given)."""
    sequence_ids: np.ndarray
    """(R, T) int64 slot of the sequence each token belongs to, -1 for padding."""
    starts: np.ndarray
    """(R, K) int64 position of each slot's first token ([CLS]); 0 for empty slots."""
    rows: np.ndarray
    """(N,) int64 row of sequence n."""
    slots: np.ndarray
    """(N,) int64 slot of sequence n within its row."""

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    def first_token(self) -> np.ndarray:
        """(N,) flat index (row * T + position) of each sequence's first token."""
        return self.rows * self.width + self.starts[self.rows, self.slots]


def lay_out(input_ids: Sequence[np.ndarray], token_type_ids: Sequence[np.ndarray] | None,
            layout: list[list[int]]) -> RowLayout:
    """Sequences `input_ids[j]` (and their segment ids) written row by row as `layout` groups
    them (`pack_rows` or `one_per_row`); rows as wide as the fullest one."""
    lengths = [len(x) for x in input_ids]
    width = max(sum(lengths[j] for j in row) for row in layout)
    slots_per_row = max(len(row) for row in layout)
    ids = np.zeros((len(layout), width), np.int64)  # (R, T)
    types = np.zeros((len(layout), width), np.int64)  # (R, T)
    sequence_ids = np.full((len(layout), width), -1, np.int64)  # (R, T)
    starts = np.zeros((len(layout), slots_per_row), np.int64)  # (R, K)
    rows = np.zeros(len(input_ids), np.int64)  # (N,)
    slots = np.zeros(len(input_ids), np.int64)  # (N,)
    for r, row in enumerate(layout):
        start = 0
        for k, j in enumerate(row):
            n = lengths[j]
            ids[r, start:start + n] = input_ids[j]
            if token_type_ids is not None:
                types[r, start:start + n] = token_type_ids[j]
            sequence_ids[r, start:start + n] = k
            starts[r, k] = start
            rows[j], slots[j] = r, k
            start += n
    return RowLayout(ids, types, sequence_ids, starts, rows, slots)
