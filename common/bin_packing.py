"""Bin packing of sequences into rows, shared by make_shards' packed shards and fine-tuning's
packed batches.

Best-fit decreasing over a histogram of free space per open row: the idea of the shortest-pack-
first histogram packing (SPFHP) of Krell et al. 2021, here per sequence and without its cap on
sequences per row (only the uint8 `sequence_ids` limit of 255).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np


def pack_lengths(lengths: Sequence[int], max_seq_length: int) -> list[list[int]]:
    """Group instance indices into rows of at most `max_seq_length` tokens.

    Best-fit decreasing: instances longest first (stable, so equal lengths keep their input
    order); each goes to the open row whose free space fits it most tightly, else a new row.
    Rows come back ordered by their first (longest) instance's input position, and instances
    inside a row in input order, so a shuffled input gives shuffled rows.
    """
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and (lengths.max() > max_seq_length or lengths.min() < 1):
        raise ValueError(f"instance lengths must be in [1, {max_seq_length}]")
    # free_rows[s]: the open rows with exactly s free tokens, oldest first.
    free_rows: list[deque[int]] = [deque() for _ in range(max_seq_length + 1)]
    has_free = np.zeros(max_seq_length + 1, bool)
    rows: list[list[int]] = []
    space: list[int] = []
    for i in np.argsort(-lengths, kind="stable").tolist():
        need = int(lengths[i])
        fits = np.flatnonzero(has_free[need:])
        if len(fits):
            s = need + int(fits[0])
            r = free_rows[s].popleft()
            has_free[s] = bool(free_rows[s])
        else:
            r, s = len(rows), max_seq_length
            rows.append([])
            space.append(s)
        rows[r].append(i)
        s -= need
        space[r] = s
        if s > 0 and len(rows[r]) < 255:  # sequence_ids are uint8
            free_rows[s].append(r)
            has_free[s] = True
    for row in rows:
        row.sort()
    rows.sort(key=lambda row: row[0])
    return rows


def unpacked_rows(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]


def padding_share(lengths: Sequence[int], rows: list[list[int]], max_seq_length: int) -> float:
    """Share of padding tokens when each row is padded to `max_seq_length`."""
    if not rows:
        return 0.0
    return 1.0 - float(np.sum(lengths)) / (len(rows) * max_seq_length)
