"""Instances in bulk: a columnar batch, a deterministic shuffle key, and packing into rows.

A Beam job moves many thousands of instances between workers. Pickling one small object per
instance costs more than making it, so instances travel as an `InstanceBatch`: a few flat
arrays (CSR style, as in the shard format) that pickle at memcpy speed and that numpy can
reorder, slice and concatenate without a Python loop over tokens.

Packing (Krell et al. 2021, "Efficient Sequence Packing without Cross-contamination"): several
short instances share one `max_seq_length` row; each keeps its own `sequence_ids` value, its
positions restart at 0 (`shard_format.position_ids`) and its next-sentence label stays its own.
The packer (`common.bin_packing`, shared with fine-tuning) is best-fit decreasing over a
histogram of free space per open row.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common import shard_format
from common.bin_packing import pack_lengths, padding_share, unpacked_rows  # noqa: F401 (this module's API)

_U64 = np.uint64
_MIX1, _MIX2, _GOLDEN = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB), _U64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser on uint64 (wrap-around arithmetic is the point)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> _U64(30))) * _MIX1
        x = (x ^ (x >> _U64(27))) * _MIX2
        return x ^ (x >> _U64(31))


def shuffle_keys(seed: int, doc_index, pass_index, instance_index) -> np.ndarray:
    """A 64-bit pseudo-random key per instance from (seed, document, pass, instance).

    Sorting by it shuffles instances across the whole corpus, and it does not depend on which
    worker made an instance or in which order, so shard contents are the same on any cluster.
    """
    x = _splitmix64(np.full(np.shape(doc_index), seed & 0xFFFFFFFFFFFFFFFF, dtype=_U64))
    for part in (doc_index, pass_index, instance_index):
        x = _splitmix64(x ^ np.asarray(part, dtype=np.int64).astype(_U64))
    return x


def _id_dtype(ids: np.ndarray) -> np.dtype:
    """uint16 halves what workers pickle and shuffle; BERT vocabularies fit it."""
    return np.dtype(np.uint16 if not ids.size or int(ids.max()) < 1 << 16 else np.int32)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


def index_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated index ranges [s, s + n) for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


@dataclass(frozen=True, eq=False)
class InstanceBatch:
    """N instances as flat arrays. T = total tokens, M = total masked positions."""
    keys: np.ndarray
    """(N,) uint64 shuffle keys (`shuffle_keys`)."""
    doc_index: np.ndarray
    """(N,) int64 dense document index within its split (provenance and tie-break)."""
    pass_index: np.ndarray
    """(N,) int32 dupe-factor pass."""
    instance_index: np.ndarray
    """(N,) int32 instance number within its document and pass."""
    lengths: np.ndarray
    """(N,) int32 tokens per instance, [CLS] and [SEP]s included."""
    input_ids: np.ndarray
    """(T,) token ids, masks applied: uint16 while every id fits (BERT vocabularies), else int32."""
    segment_ids: np.ndarray
    """(T,) uint8."""
    num_masked: np.ndarray
    """(N,) int32 masked positions per instance."""
    masked_lm_positions: np.ndarray
    """(M,) uint16, relative to the instance's first token (max_seq_length < 65536)."""
    masked_lm_ids: np.ndarray
    """(M,) original ids, the dtype of `input_ids`."""
    next_sentence_labels: np.ndarray
    """(N,) int8: 1 random next, 0 actual next, -1 MLM-only."""

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_instances(cls, instances: Sequence, keys, doc_index, pass_index,
                       instance_index) -> InstanceBatch:
        """Columnar form of `pipelines.shards.instances.Instance` objects and their provenance."""
        def cat(arrays, dtype=None):
            if not arrays:
                return np.zeros(0, dtype or np.uint16)
            joined = np.concatenate(arrays)
            return joined.astype(dtype or _id_dtype(joined), copy=False)

        return cls(
            keys=np.asarray(keys, _U64), doc_index=np.asarray(doc_index, np.int64),
            pass_index=np.asarray(pass_index, np.int32),
            instance_index=np.asarray(instance_index, np.int32),
            lengths=np.array([len(i.input_ids) for i in instances], np.int32),
            input_ids=cat([i.input_ids for i in instances]),
            segment_ids=cat([i.segment_ids for i in instances], np.uint8),
            num_masked=np.array([len(i.masked_lm_positions) for i in instances], np.int32),
            masked_lm_positions=cat([i.masked_lm_positions for i in instances], np.uint16),
            masked_lm_ids=cat([i.masked_lm_ids for i in instances]),
            next_sentence_labels=np.array([i.next_sentence_label for i in instances], np.int8),
        )

    @classmethod
    def concat(cls, batches: Sequence[InstanceBatch]) -> InstanceBatch:
        """One batch of all instances in order (ids widen to int32 if any part needs it)."""
        dtypes = {"keys": _U64, "doc_index": np.int64, "pass_index": np.int32,
                  "instance_index": np.int32, "lengths": np.int32, "input_ids": None,
                  "segment_ids": np.uint8, "num_masked": np.int32,
                  "masked_lm_positions": np.uint16, "masked_lm_ids": None,
                  "next_sentence_labels": np.int8}

        def join(name, dtype):
            if not batches:
                return np.zeros(0, dtype or np.uint16)
            parts = [getattr(b, name) for b in batches]
            return np.concatenate(parts).astype(dtype or np.result_type(*parts), copy=False)

        return cls(**{name: join(name, dtype) for name, dtype in dtypes.items()})

    def take(self, order: np.ndarray) -> InstanceBatch:
        """The instances at `order` (an index array), in that order."""
        order = np.asarray(order, np.int64)
        tok = index_ranges(_offsets(self.lengths)[:-1][order], self.lengths[order])
        msk = index_ranges(_offsets(self.num_masked)[:-1][order], self.num_masked[order])
        return InstanceBatch(
            keys=self.keys[order], doc_index=self.doc_index[order],
            pass_index=self.pass_index[order], instance_index=self.instance_index[order],
            lengths=self.lengths[order], input_ids=self.input_ids[tok],
            segment_ids=self.segment_ids[tok], num_masked=self.num_masked[order],
            masked_lm_positions=self.masked_lm_positions[msk],
            masked_lm_ids=self.masked_lm_ids[msk],
            next_sentence_labels=self.next_sentence_labels[order],
        )

    def shuffled(self) -> InstanceBatch:
        """Sorted by shuffle key; ties (never seen in practice) broken by provenance."""
        order = np.lexsort((self.instance_index, self.pass_index, self.doc_index, self.keys))
        return self.take(order)


def rows_order(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(instance order, instances per row) that lay the rows out contiguously."""
    order = np.array([i for row in rows for i in row], np.int64)
    return order, np.array([len(row) for row in rows], np.int64)


def to_rows(batch: InstanceBatch, row_sizes: np.ndarray) -> list[shard_format.Row]:
    """Shard rows from instances laid out contiguously, `row_sizes[r]` instances per row."""
    tok_off, msk_off = _offsets(batch.lengths), _offsets(batch.num_masked)
    rows = []
    first = 0
    for size in np.asarray(row_sizes).tolist():
        last = first + size
        t0, t1 = int(tok_off[first]), int(tok_off[last])
        m0, m1 = int(msk_off[first]), int(msk_off[last])
        lengths = batch.lengths[first:last]
        # Positions are instance-relative in the batch; a packed row shifts them by the
        # tokens of the instances before it in the row.
        shift = np.repeat(tok_off[first:last] - t0, batch.num_masked[first:last])
        rows.append(shard_format.Row(
            input_ids=batch.input_ids[t0:t1],
            segment_ids=batch.segment_ids[t0:t1],
            sequence_ids=np.repeat(np.arange(size, dtype=np.uint8), lengths),
            masked_lm_positions=batch.masked_lm_positions[m0:m1] + shift,
            masked_lm_ids=batch.masked_lm_ids[m0:m1],
            next_sentence_labels=batch.next_sentence_labels[first:last],
        ))
        first = last
    return rows


def encode_blocks(batch: InstanceBatch, row_sizes: np.ndarray, rows_per_block: int,
                  vocab_size: int) -> Iterator[bytes]:
    """`.rows.npz` members for rows laid out contiguously, `rows_per_block` rows each.

    The bytes equal `shard_format.encode_block(to_rows(...))` block by block, computed over
    the whole batch with a few numpy calls instead of a loop over rows.
    """
    row_sizes = np.asarray(row_sizes, np.int64)
    num_rows = len(row_sizes)
    row_first = _offsets(row_sizes)  # (R + 1,) first instance of each row
    tok_off, msk_off = _offsets(batch.lengths), _offsets(batch.num_masked)
    # Per instance: its index inside its row and its first token's offset inside its row.
    row_of = np.repeat(np.arange(num_rows), row_sizes)
    index_in_row = np.arange(len(batch)) - row_first[:-1][row_of]
    start_in_row = tok_off[:-1] - tok_off[row_first[:-1]][row_of]
    sequence_ids = np.repeat(index_in_row, batch.lengths)
    positions = batch.masked_lm_positions + np.repeat(start_in_row, batch.num_masked)
    row_tok = tok_off[row_first]  # (R + 1,) token offset of each row
    row_msk = msk_off[row_first]
    for r0 in range(0, num_rows, rows_per_block):
        r1 = min(r0 + rows_per_block, num_rows)
        i0, i1 = row_first[r0], row_first[r1]
        t0, t1, m0, m1 = row_tok[r0], row_tok[r1], row_msk[r0], row_msk[r1]
        yield shard_format.encode_arrays({
            "row_lengths": np.diff(row_tok[r0:r1 + 1]),
            "input_ids": batch.input_ids[t0:t1],
            "segment_ids": batch.segment_ids[t0:t1],
            "sequence_ids": sequence_ids[t0:t1],
            "num_masked": np.diff(row_msk[r0:r1 + 1]),
            "masked_lm_positions": positions[m0:m1],
            "masked_lm_ids": batch.masked_lm_ids[m0:m1],
            "num_instances": row_sizes[r0:r1],
            "next_sentence_labels": batch.next_sentence_labels[i0:i1],
        }, vocab_size)
