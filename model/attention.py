"""Which tokens attend to which: instance ids of packed and padded rows, attention masks, and
per-instance attention from a plan made on the host (as MosaicBERT keeps `bert_padding.py` beside
its model).

A token attends only to the tokens of its own instance, so a packed row gives exactly the hidden
states of its instances computed one by one. Two ways, one result:

- On the CPU attention runs per instance (`attention_plan`, built once per batch from
  `sequence_ids` and `attention_mask`; in training the data loader builds it, see
  `BatchLayout`): the instances are gathered into (instances, length) blocks bucketed by
  length, so a packed row costs sum(n_k^2) rather than T^2 and no T x T block-diagonal mask
  (nor its dropout draws) is made.
- On a GPU attention takes whole rows under the block-diagonal mask (`attention_mask_4d`): one
  SDPA call per layer, its memory-efficient or cuDNN kernel with dropout fused, as
  transformers' BERT runs. The variable-length alternative (each run of tokens a sequence of a
  jagged nested tensor) spent its time in the nested tensor's Python dispatch: a MiniLM SQuAD
  step took 97 ms of host time against 7 ms of device time on an H200 (RESULTS 16), and under
  torch.compile its per-batch run lengths recompiled the layers past dynamo's limit.

Dense batches without padding call SDPA without a mask, so it may pick its flash kernel.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from model.cpu_ops import attend

PADDING_SEQUENCE_ID = -1
"""Instance id of padding tokens."""


def packed_position_ids(sequence_ids: Tensor) -> Tensor:
    """Positions restarting at 0 at each instance boundary of a row. (B, T) -> (B, T)

    The torch twin of `common.shard_format.position_ids`.
    """
    idx = torch.arange(sequence_ids.shape[-1], device=sequence_ids.device).expand_as(sequence_ids)
    starts = torch.ones_like(sequence_ids, dtype=torch.bool)
    starts[:, 1:] = sequence_ids[:, 1:] != sequence_ids[:, :-1]
    return idx - torch.where(starts, idx, 0).cummax(dim=-1).values


def instance_ids(attention_mask: Tensor | None, sequence_ids: Tensor | None,
                 like: Tensor) -> Tensor | None:
    """Instance index per token with padding as -1 (B, T), or None when every row is one instance."""
    if sequence_ids is None and attention_mask is None:
        return None
    ids = torch.zeros_like(like) if sequence_ids is None else sequence_ids.long()
    if attention_mask is not None:
        ids = ids.masked_fill(~attention_mask.bool(), PADDING_SEQUENCE_ID)
    return ids


def one_instance_per_row(ids: Tensor | None) -> bool:
    """Whether every row is one instance without padding, so that attention needs no mask."""
    return ids is None or bool((ids == ids[:, :1]).all())


def attention_mask_4d(ids: Tensor | None) -> Tensor | None:
    """Boolean SDPA mask (B, 1, T, T), True = may attend, or None when nothing is masked.

    Query i sees key j iff both belong to the same instance. Padding tokens (-1) see only padding,
    so no row is fully masked (SDPA would return NaN there); their outputs are never used.
    """
    return None if one_instance_per_row(ids) else query_attention_mask(ids, None)


def query_attention_mask(ids: Tensor, query_index: Tensor | None) -> Tensor:
    """The mask of `attention_mask_4d` for the queries at `query_index` (B, P) only (all
    queries when None): (B, 1, P, T)."""
    queries = ids if query_index is None else ids.gather(1, query_index)  # (B, P)
    return (queries[:, :, None] == ids[:, None, :])[:, None]  # (B, 1, P, T)


def causal_attention_mask(ids: Tensor | None, query_index: Tensor | None, length: int,
                          device: torch.device) -> Tensor:
    """Left-to-right attention: query i sees key j iff j <= i and, when `ids` (B, T) is given,
    both belong to the same instance. (B or 1, 1, P, T) for the queries at `query_index`
    (B, P), all T queries when None. Every query sees itself, so no row is fully masked."""
    keys = torch.arange(length, device=device)
    queries = keys[None, :] if query_index is None else query_index  # (1 or B, P)
    mask = (keys[None, None, :] <= queries[:, :, None])[:, None]  # (1 or B, 1, P, T)
    return mask if ids is None else mask & query_attention_mask(ids, query_index)


def window_mask(length: int, window: int, device: torch.device) -> Tensor | None:
    """(1, 1, T, T) True where |i - j| <= window (a local attention layer's band); None when
    every pair of the row is within it."""
    if length - 1 <= window:
        return None
    band = torch.ones(length, length, dtype=torch.bool, device=device)
    return band.triu_(-window).tril_(window)[None, None]  # no T x T int64 differences


@dataclass(frozen=True)
class AttentionPattern:
    """Which tokens of its instance a token sees: all of them (BERT), or itself and the
    earlier ones (`causal`: the left-to-right LM, transformers' `is_decoder`). The encoder asks
    its pattern, never its objective: the layout attention runs in, the whole-row mask, and
    which token has seen its whole instance (the one the pooler reads)."""

    causal: bool = False

    def layout(self, layout: BatchLayout | None) -> BatchLayout | None:
        """Causal attention takes whole rows under `row_mask` (per instance in packed rows):
        the per-instance plan (`attention_plan`) attends both ways."""
        return BatchLayout(None, masked=True) if self.causal else layout

    def row_mask(self, ids: Tensor | None, query_index: Tensor | None, length: int,
                 device: torch.device) -> Tensor:
        """The boolean mask of whole-row attention (B or 1, 1, P, T)."""
        if self.causal:
            return causal_attention_mask(ids, query_index, length, device)
        return query_attention_mask(ids, query_index)

    def summary_positions(self, cls_positions: Tensor | None, sequence_ids: Tensor | None,
                          rows: int, length: int, device: torch.device) -> Tensor:
        """(B, K) where each instance's summary token is: its [CLS] at `cls_positions` (B, K)
        ((B, 1) zeros when None); under causal attention its last token instead, the only one
        that has seen the whole instance (as OpenAI GPT classifies), from `sequence_ids`
        (B, T) (padding -1; None: the row's last position)."""
        if self.causal:
            instances = 1 if cls_positions is None else cls_positions.shape[1]
            return last_positions(sequence_ids, length, rows, instances, device)
        if cls_positions is None:
            return torch.zeros(rows, 1, dtype=torch.long, device=device)
        return cls_positions.long().clamp(min=0)


def last_positions(sequence_ids: Tensor | None, length: int, rows: int, instances: int,
                   device: torch.device) -> Tensor:
    """Last position of instances 0..K-1 in each row (B, K), from `sequence_ids` (B, T) with
    padding -1 (None: one instance filling the row); a missing instance gets 0."""
    if sequence_ids is None:
        return torch.full((rows, instances), length - 1, dtype=torch.long, device=device)
    k = torch.arange(instances, device=device)
    is_k = sequence_ids[:, None, :] == k[None, :, None]  # (B, K, T)
    index = torch.arange(length, device=device)
    return torch.where(is_k, index, -1).amax(-1).clamp(min=0)  # (B, K)


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Fused projections (N, T, 3H) -> q, k, v, each (N, A, T, D)."""
    N, T, H3 = qkv.shape
    q, k, v = (qkv.view(N, T, 3, num_heads, H3 // (3 * num_heads))  # (N, T, 3, A, D)
               .permute(2, 0, 3, 1, 4)  # (3, N, A, T, D)
               .unbind(0))
    return q, k, v


@dataclass(frozen=True)
class InstanceGroup:
    """Instances of similar length that go through one attention call (CPU path)."""

    index: Tensor
    """(G, n) flat token index (row * T + position) of each slot; a slot past its instance's end
    repeats the instance's first token (masked out as a key, its output dropped)."""
    key_mask: Tensor | None
    """(G, 1, 1, n) True at the instance's own tokens; None when all G instances have n tokens."""
    real: Tensor | None
    """(G, n) True at the instance's own tokens; None when all G instances have n tokens."""


@dataclass(frozen=True)
class AttentionPlan:
    """Where each instance of a batch is, so that attention runs per instance (no T x T mask).

    A packed row of K instances costs sum(n_k^2) in attention instead of T^2, with no mask and
    no attention dropout draws between instances. Every index is made on the host, so the
    forward and backward pass select and place tokens without asking the device anything
    (boolean indexing or `nonzero` would wait for the device to count first).

    The CPU's form of attention (`attend_instances`); on other devices attention takes whole
    rows under a mask and the plan stays on the host (`BatchLayout.to`).
    """

    groups: tuple[InstanceGroup, ...]
    """Instances bucketed by length (each bucket padded to its longest member)."""
    slot_index: Tensor
    """(S,) every group's `index`, flattened and concatenated: one gather for all groups (its
    backward is then one scatter-add rather than one full-size gradient per group)."""
    real_slots: Tensor | None
    """(N_real,) position in those S slots of every real token, in `token_index` order; None
    when every slot is real (no bucket is padded)."""
    token_index: Tensor
    """(N_real,) flat index of every real token, in the order the groups return them."""


ATTENTION_BUCKET = 32
"""Instances whose lengths round up to the same multiple of this share one attention call:
fewer, larger calls at the price of a little padding inside a bucket."""


def attention_plan(ids: Tensor | None, bucket: int = ATTENTION_BUCKET) -> AttentionPlan | None:
    """The instances of a batch from its instance ids (B, T) (padding = -1, see `instance_ids`).

    None when there is nothing to split (every row is one instance filling all T tokens), or
    when an instance's tokens are not one contiguous run (padding inside it, say): the caller
    then masks whole rows (`attention_mask_4d`).
    """
    if ids is None:
        return None
    B, T = ids.shape
    flat = ids.reshape(-1).cpu().numpy()
    # a new run starts at every row start and wherever the id changes
    all_starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]] | (np.arange(B * T) % T == 0))
    all_lengths = np.diff(np.r_[all_starts, B * T])
    keep = flat[all_starts] != PADDING_SEQUENCE_ID
    starts, lengths = all_starts[keep], all_lengths[keep]
    if len(starts) == B and (lengths == T).all():
        return None
    runs = np.stack([starts // T, flat[starts]], axis=1)  # (row, instance id) of every run
    if len(np.unique(runs, axis=0)) < len(runs):  # an instance in two runs
        return None
    device = ids.device
    buckets = -(-lengths // bucket)
    groups, order, real_slots, slots = [], [], [], 0
    for b in np.unique(buckets):
        members = np.flatnonzero(buckets == b)
        n = int(lengths[members].max())
        offsets = np.arange(n)
        real = offsets[None, :] < lengths[members, None]  # (G, n)
        index = starts[members, None] + np.where(real, offsets[None, :], 0)  # (G, n)
        order.append(index[real])
        real_slots.append(slots + np.flatnonzero(real))
        slots += real.size
        padded = not real.all()
        real_t = torch.from_numpy(real).to(device)
        groups.append(InstanceGroup(
            index=torch.from_numpy(index).to(device),
            key_mask=real_t[:, None, None, :] if padded else None,
            real=real_t if padded else None))
    if not groups:  # a batch of padding only
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return AttentionPlan((), empty, None, empty)
    token_index = np.concatenate(order)
    real_slots = np.concatenate(real_slots)
    return AttentionPlan(
        tuple(groups), torch.cat([g.index.flatten() for g in groups]),
        None if len(real_slots) == slots else torch.from_numpy(real_slots).to(device),
        torch.from_numpy(token_index).to(device))


@dataclass(frozen=True)
class BatchLayout:
    """How a batch's instances lie in its rows, worked out on the host: a data loader makes it
    with the batch (`batch_layout`), so the forward pass never waits for the device to answer
    a question about its input (on a GPU each such question stalls the kernel queue)."""

    plan: AttentionPlan | None
    """Per-instance attention (`attention_plan`); None: whole rows, masked if `masked`."""
    masked: bool
    """False when every row is one instance without padding: attention takes no mask."""

    def to(self, device: torch.device | str, non_blocking: bool = False) -> BatchLayout:
        """The layout for a forward pass on `device`: on the CPU with its plan; elsewhere
        attention takes whole rows under a mask (the module docstring says why), so only
        `masked` goes and the plan's index tensors are not copied."""
        if torch.device(device).type != "cpu":
            return BatchLayout(None, self.masked)
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> BatchLayout:
        """What a DataLoader with pin_memory=True asks of batch items, for a copy to a GPU:
        there attention takes whole rows (`to`), so the plan is left behind, not pinned."""
        return BatchLayout(None, self.masked)

    def _map(self, fn: Callable[[Tensor], Tensor]) -> BatchLayout:
        if self.plan is None:
            return self

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else fn(t)

        groups = tuple(InstanceGroup(move(g.index), move(g.key_mask), move(g.real))
                       for g in self.plan.groups)
        plan = dataclasses.replace(
            self.plan, groups=groups, slot_index=move(self.plan.slot_index),
            real_slots=move(self.plan.real_slots), token_index=move(self.plan.token_index))
        return BatchLayout(plan, self.masked)


def batch_layout(ids: Tensor | None, plan: bool = True) -> BatchLayout:
    """The `BatchLayout` of instance ids (B, T) (`instance_ids`), on the host; `plan=False`
    leaves out the per-instance plan, which only the CPU's attention uses."""
    if ids is None:
        return BatchLayout(None, masked=False)
    ids = ids.cpu()
    return BatchLayout(attention_plan(ids) if plan else None,
                       masked=not one_instance_per_row(ids))


def attend_instances(qkv: Tensor, plan: AttentionPlan, num_heads: int,
                     dropout_p: float) -> Tensor:
    """Attention per length bucket of instances. qkv (B, T, 3H) -> (B, T, H), 0 at padding."""
    B, T, H3 = qkv.shape
    slots = qkv.reshape(B * T, H3).index_select(0, plan.slot_index)  # (S, 3H)
    outputs = []
    for group, part in zip(plan.groups, slots.split([g.index.numel() for g in plan.groups])):
        q, k, v = split_heads(part.view(*group.index.shape, H3), num_heads)  # 3 x (G, A, n, D)
        y = attend(q, k, v, group.key_mask, dropout_p).transpose(1, 2)  # (G, n, A, D)
        outputs.append(y.flatten(0, 1).flatten(1))  # (G * n, H)
    out = qkv.new_zeros(B * T, H3 // 3)
    if not outputs:  # a batch of padding only
        return out.view(B, T, H3 // 3)
    y = torch.cat(outputs)  # (S, H)
    if plan.real_slots is not None:
        y = y.index_select(0, plan.real_slots)  # (N_real, H) in plan.token_index order
    return out.index_copy(0, plan.token_index, y).view(B, T, H3 // 3)  # (B*T, H) -> (B, T, H)
