"""The pretraining shard format: WebDataset `.tar` shards of row blocks.

A *row* is one model input of at most `max_seq_length` tokens: one pretraining instance, or
with packing several instances side by side. Rows are stored unpadded.

A tar header costs 512 bytes, more than a 128-token row, so rows are grouped: each tar member
is a *block* of up to `rows_per_block` rows, written as one uncompressed `.npz` (WebDataset's
default decoder reads it; `decode_block` turns it back into rows). Key layout of a member,
named `<block key>.rows.npz` (block key `{shard:06d}-{block:06d}`), all arrays flat and
concatenated over the block's rows in order (CSR style):

| array                   | shape             | dtype                  | meaning |
|-------------------------|-------------------|------------------------|---------|
| `row_lengths`           | (R,)              | uint16                 | tokens in each row |
| `input_ids`             | (sum lengths,)    | uint16 (uint32 if vocab_size > 65536) | token ids |
| `segment_ids`           | (sum lengths,)    | uint8                  | 0 = sentence A (with `[CLS]` and first `[SEP]`), 1 = B |
| `sequence_ids`          | (sum lengths,)    | uint8                  | index of the instance within its row (all 0 unpacked) |
| `num_masked`            | (R,)              | uint16                 | masked positions in each row |
| `masked_lm_positions`   | (sum num_masked,) | uint16                 | row-relative positions, ascending |
| `masked_lm_ids`         | (sum num_masked,) | as `input_ids`         | the original token ids at those positions |
| `num_instances`         | (R,)              | uint8                  | instances in each row (1 unpacked) |
| `next_sentence_labels`  | (sum num_instances,) | int8                | 1 = B is a random segment, 0 = B is the actual next; -1 = MLM-only (no NSP) |

Label convention: `next_sentence_label = 1` means *random next* (as in BERT's reference code and
Hugging Face's `next_sentence_label`), 0 means B actually follows A.
Positions restart at 0 for each instance of a packed row (derived from `sequence_ids`).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

MEMBER_SUFFIX = "rows.npz"
NO_NSP_LABEL = -1


@dataclass(frozen=True)
class Row:
    """One model input row, unpadded. Shapes: (T,) for token arrays, (M,) masked, (K,) instances."""
    input_ids: np.ndarray
    segment_ids: np.ndarray
    sequence_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    next_sentence_labels: np.ndarray

    def __post_init__(self):
        n = len(self.input_ids)
        if len(self.segment_ids) != n or len(self.sequence_ids) != n:
            raise ValueError("input_ids, segment_ids and sequence_ids must have equal length")
        if len(self.masked_lm_positions) != len(self.masked_lm_ids):
            raise ValueError("masked_lm_positions and masked_lm_ids must have equal length")


def id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def encode_block(rows: list[Row], vocab_size: int) -> bytes:
    """Serialise rows to the bytes of one `.rows.npz` tar member."""
    ids = id_dtype(vocab_size)

    def cat(name: str, dtype) -> np.ndarray:
        parts = [np.asarray(getattr(r, name)) for r in rows]
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    arrays = {
        "row_lengths": np.array([len(r.input_ids) for r in rows], np.uint16),
        "input_ids": cat("input_ids", ids),
        "segment_ids": cat("segment_ids", np.uint8),
        "sequence_ids": cat("sequence_ids", np.uint8),
        "num_masked": np.array([len(r.masked_lm_positions) for r in rows], np.uint16),
        "masked_lm_positions": cat("masked_lm_positions", np.uint16),
        "masked_lm_ids": cat("masked_lm_ids", ids),
        "num_instances": np.array([len(r.next_sentence_labels) for r in rows], np.uint8),
        "next_sentence_labels": cat("next_sentence_labels", np.int8),
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def decode_block(data) -> list[Row]:
    """Rows from a member's bytes, or from the mapping WebDataset's npz decoder returns."""
    arrays = np.load(io.BytesIO(data)) if isinstance(data, (bytes, bytearray)) else data
    token_ends = np.cumsum(arrays["row_lengths"])
    mask_ends = np.cumsum(arrays["num_masked"])
    inst_ends = np.cumsum(arrays["num_instances"])
    split = lambda name, ends: np.split(np.asarray(arrays[name]), ends[:-1])
    columns = zip(
        split("input_ids", token_ends), split("segment_ids", token_ends),
        split("sequence_ids", token_ends), split("masked_lm_positions", mask_ends),
        split("masked_lm_ids", mask_ends), split("next_sentence_labels", inst_ends),
    )
    return [Row(*c) for c in columns] if len(token_ends) else []


def position_ids(sequence_ids: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 at each instance boundary of a packed row. (T,) -> (T,)"""
    seq = np.asarray(sequence_ids)
    idx = np.arange(len(seq))
    starts = np.concatenate([[True], seq[1:] != seq[:-1]]) if len(seq) else np.zeros(0, bool)
    return idx - np.maximum.accumulate(np.where(starts, idx, 0))


BLOCK_DTYPES = {  # the arrays of a block member in file order; None = the id dtype
    "row_lengths": np.uint16, "input_ids": None, "segment_ids": np.uint8,
    "sequence_ids": np.uint8, "num_masked": np.uint16, "masked_lm_positions": np.uint16,
    "masked_lm_ids": None, "num_instances": np.uint8, "next_sentence_labels": np.int8,
}


def encode_arrays(arrays: dict, vocab_size: int) -> bytes:
    """Serialise a block given directly as its flat arrays (the table above).

    The same bytes as `encode_block` on the equivalent rows, for writers that hold rows in
    columnar form and would otherwise build one `Row` per row only to concatenate them again.
    """
    if set(arrays) != set(BLOCK_DTYPES):
        raise ValueError(f"block arrays must be exactly {sorted(BLOCK_DTYPES)}")
    ids = id_dtype(vocab_size)
    ordered = {name: np.asarray(arrays[name]).astype(dtype or ids, copy=False)
               for name, dtype in BLOCK_DTYPES.items()}
    buffer = io.BytesIO()
    np.savez(buffer, **ordered)
    return buffer.getvalue()
