"""Rows -> padded micro-batches (`collate`), and the static shapes that give every batch of a
phase one shape.

Static shapes (`LoaderConfig.static_shapes`, `StaticShapes`): every batch of a phase is
[batch_size, max_seq_length] with the same masked positions and instances per row, padded with
`IGNORE_INDEX` labels, so a compiled step is captured once rather than once per shape. A slot
yields whole micro-batches only (`training.loader.plan_epoch`), and a batch of fewer rows would
be padded to `batch_size` all the same, so neither the end of an epoch nor validation changes
the shape.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common import shard_format
from common.shard_format import Row
from model.attention import PADDING_SEQUENCE_ID, BatchLayout, batch_layout, instance_ids
from model.heads import IGNORE_INDEX

log = logging.getLogger(__name__)


def collate(rows: Sequence[Row], pad_to_multiple_of: int = 8,
            max_seq_length: int | None = None, attention_plan: bool = True,
            static: StaticShapes | None = None,
            batch_size: int | None = None) -> dict[str, torch.Tensor | BatchLayout]:
    """Rows -> the padded batch `model.heads.BertForPreTraining` takes (see its docstring),
    with its `layout` (`model.attention.BatchLayout`) worked out here on the host, with the
    per-instance attention plan if `attention_plan` (`LoaderConfig.attention_plan`).

    T = longest row rounded up to `pad_to_multiple_of` (at most `max_seq_length`); M = most
    masked positions; K = most instances per row. `next_sentence_label` is (B,) for unpacked rows,
    else (B, K) with `cls_positions` (B, K).

    `static` (`StaticShapes`): B = `batch_size` (rows past the given ones are padding: no
    token, no label), T = `max_seq_length`, M and K from `static.fit`, and the layout always
    masked, so every batch of a phase has one shape and one graph.
    """
    b = len(rows)
    longest = max(len(r.input_ids) for r in rows)
    t = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    t = min(t, max_seq_length) if max_seq_length else t
    m = max(1, max(len(r.masked_lm_positions) for r in rows))
    k = max(len(r.next_sentence_labels) for r in rows)
    if static is not None:
        if not max_seq_length or not batch_size or batch_size < b:
            raise ValueError(f"static shapes need max_seq_length and a batch_size >= the {b} "
                             f"rows, got {max_seq_length} and {batch_size}")
        b, t, (m, k) = batch_size, max_seq_length, static.fit(m, k)
    input_ids = np.zeros((b, t), np.int64)
    token_type_ids = np.zeros((b, t), np.int64)
    attention_mask = np.zeros((b, t), np.int64)
    sequence_ids = np.full((b, t), PADDING_SEQUENCE_ID, np.int64)
    position_ids = np.zeros((b, t), np.int64)
    positions = np.zeros((b, m), np.int64)
    labels = np.full((b, m), IGNORE_INDEX, np.int64)
    nsp = np.full((b, k), IGNORE_INDEX, np.int64)
    cls_positions = np.zeros((b, k), np.int64)
    for i, r in enumerate(rows):
        n, nm, nk = len(r.input_ids), len(r.masked_lm_positions), len(r.next_sentence_labels)
        input_ids[i, :n] = r.input_ids
        token_type_ids[i, :n] = r.segment_ids
        attention_mask[i, :n] = 1
        sequence_ids[i, :n] = r.sequence_ids
        position_ids[i, :n] = shard_format.position_ids(r.sequence_ids)
        positions[i, :nm] = r.masked_lm_positions
        labels[i, :nm] = r.masked_lm_ids
        nsp[i, :nk] = r.next_sentence_labels
        cls_positions[i, :nk] = np.flatnonzero(position_ids[i, :n] == 0)[:nk]
    batch = {
        "input_ids": input_ids, "token_type_ids": token_type_ids,
        "attention_mask": attention_mask, "sequence_ids": sequence_ids,
        "position_ids": position_ids, "masked_lm_positions": positions, "masked_lm_ids": labels,
    }
    if k == 1:
        batch["next_sentence_label"] = nsp[:, 0]
    else:
        batch["next_sentence_label"] = nsp
        batch["cls_positions"] = cls_positions
    tensors = {name: torch.from_numpy(a) for name, a in batch.items()}
    # The attention plan is host work: done here, in the loader's workers, not in the forward.
    layout = batch_layout(instance_ids(
        tensors["attention_mask"], tensors["sequence_ids"], tensors["input_ids"]),
        plan=attention_plan)
    # static: always masked, or a batch without padding would take a second, unmasked graph
    tensors["layout"] = BatchLayout(layout.plan, masked=True) if static is not None else layout
    return tensors


@dataclass(frozen=True)
class StaticShapes:
    """The sizes that make every batch of a phase one shape [B, T] (B = the loader's
    `batch_size`, T = its `max_seq_length`), so that a compiled step is captured once
    (`model.compiling.compile_model`). Padding positions have label `IGNORE_INDEX`: the losses
    are those of the unpadded batch."""
    predictions: int
    """M: masked positions per row (`masked_lm_positions` (B, M), padding at position 0)."""
    instances: int
    """K: instances per row; 1 = unpacked rows (`next_sentence_label` (B,)), else (B, K) with
    `cls_positions` (B, K)."""

    def __post_init__(self):
        if self.predictions < 1 or self.instances < 1:
            raise ValueError(f"static shapes need predictions and instances >= 1, got "
                             f"{self.predictions} and {self.instances}")

    def fit(self, predictions: int, instances: int) -> tuple[int, int]:
        """(M, K) for a batch whose rows need up to `predictions` and `instances`: the static
        sizes; a batch past them (a packed row of unusually many short instances) takes the
        next multiple of 8 masked positions / of `instances`, which a compiled step compiles
        once more, rather than losing a label or stopping the run."""
        m, k = self.predictions, self.instances
        if predictions > m:
            m = -(-predictions // 8) * 8
        if instances > k:
            k = -(-instances // k) * k
        if (m, k) != (self.predictions, self.instances):
            log.warning("a batch needs %d masked positions and %d instances per row, past the "
                        "static shapes' %d and %d: it takes M=%d, K=%d (a compiled step "
                        "compiles once more)", predictions, instances, self.predictions,
                        self.instances, m, k)
        return m, k


STATIC_INSTANCE_TOKENS = 32
"""Packed rows under static shapes hold up to max_seq_length / this instances (16 at 512 tokens;
the books' packed shards hold at most 11 in a row, Wikipedia's 1.15 on average). Each unused
slot costs one more query through the last layer and the NSP head: little."""


def static_shapes_for(manifest: dict, max_seq_length: int) -> StaticShapes:
    """The `StaticShapes` of a phase's shards, from their manifest. Unpacked rows (`packed`:
    false) hold one instance with at most `max_predictions_per_seq` masked positions. A packed
    row's instances each round their share of it up, by at most one position each, so
    M = max_predictions_per_seq + K covers them (the books' packed rows at 512 tokens reach 78
    with max_predictions_per_seq 76)."""
    from training.memory import max_predictions

    predictions = int(manifest.get("max_predictions_per_seq") or max_predictions(max_seq_length))
    if manifest.get("packed") is False:
        return StaticShapes(predictions, 1)
    instances = max(2, max_seq_length // STATIC_INSTANCE_TOKENS)
    return StaticShapes(predictions + instances, instances)

