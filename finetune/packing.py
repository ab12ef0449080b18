"""Packed batches for every fine-tuning family: several sequences share one row of tokens.

The bin packing is pre-training's (`common.bin_packing.pack_lengths`, best-fit decreasing);
`lay_out` writes the sequences into the rows and says where each one landed (`RowLayout`;
`SlotBatch` is that layout as tensors with its labels, GLUE's and multiple choice's batches);
`pad` is the unpacked layout, one sequence per row. The encoder's per-instance attention
(`sequence_ids`: which sequence of its row a token belongs to, -1 for padding) keeps each
sequence on its own, so outputs are those of one sequence per padded row, without the pad
tokens' work. GLUE, multiple choice, NER and SQuAD build their batches from this one layout.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import numpy as np
import torch

from common import bin_packing

Array = TypeVar("Array", np.ndarray, torch.Tensor)


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
class RowLayout(Generic[Array]):
    """N sequences written into R rows of T tokens, at most K per row (int64 arrays from
    `lay_out`, tensors in a `SlotBatch`)."""

    input_ids: Array
    """(R, T) token ids, 0 after a row's last sequence."""
    token_type_ids: Array
    """(R, T) segment ids (0 where none were given)."""
    sequence_ids: Array
    """(R, T) slot of the sequence each token belongs to, -1 for padding."""
    cls_positions: Array
    """(R, K) position of each slot's first token ([CLS]); 0 for empty slots."""
    rows: Array
    """(N,) row of sequence n."""
    slots: Array
    """(N,) slot of sequence n within its row."""

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    def first_token(self) -> np.ndarray:
        """(N,) flat index (row * T + position) of each sequence's first token."""
        return self.rows * self.width + self.cls_positions[self.rows, self.slots]


@dataclass(frozen=True)
class SlotBatch(RowLayout[torch.Tensor]):
    """A batch whose examples are read at their sequences' [CLS] slots (GLUE's
    `PackedBatch`, multiple choice's `ChoiceBatch`): the layout as tensors, `rows` and
    `slots` shaped per example (B,) or per example and choice (B, C), and the labels."""

    labels: torch.Tensor
    """(B,) one label per example."""

    @classmethod
    def of(cls, layout: RowLayout[np.ndarray], labels: np.ndarray,
           shape: tuple[int, ...] = (-1,)) -> SlotBatch:
        """`layout`'s arrays as tensors, its rows and slots viewed as `shape`."""
        tensors = {f.name: torch.from_numpy(getattr(layout, f.name)) for f in fields(layout)}
        return cls(**tensors | {"rows": tensors["rows"].view(shape),
                                "slots": tensors["slots"].view(shape)},
                   labels=torch.from_numpy(labels))


def pad(sequences: Sequence[np.ndarray], fill: int = 0) -> np.ndarray:
    """(B, T) int64: sequence b at the start of row b, `fill` after it; T = the longest (the
    unpacked batch's layout, dynamic padding)."""
    out = np.full((len(sequences), max(len(x) for x in sequences)), fill, np.int64)  # (B, T)
    for row, x in enumerate(sequences):
        out[row, :len(x)] = x
    return out


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
    cls_positions = np.zeros((len(layout), slots_per_row), np.int64)  # (R, K)
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
            cls_positions[r, k] = start
            rows[j], slots[j] = r, k
            start += n
    return RowLayout(ids, types, sequence_ids, cls_positions, rows, slots)
