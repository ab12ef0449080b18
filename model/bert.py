"""The BERT encoder (Devlin et al. 2019, arXiv:1810.04805), in one file.

Embeddings (word + learned position + token type, LayerNorm, dropout), then `num_hidden_layers`
post-LayerNorm Transformer blocks (self-attention through
`torch.nn.functional.scaled_dot_product_attention`, GELU feed-forward), then the pooler
(dense + tanh on the `[CLS]` state, paper section 3 and figure 1).

Inputs of `BertModel.forward` (B = batch rows, T = tokens per row):

| argument          | shape  | meaning |
|-------------------|--------|---------|
| `input_ids`       | (B, T) | token ids |
| `token_type_ids`  | (B, T) | 0 = sentence A, 1 = sentence B (zeros when None) |
| `attention_mask`  | (B, T) | 1/True = real token, 0/False = padding (all real when None) |
| `sequence_ids`    | (B, T) | packed rows: index of the instance each token belongs to (0, 1, ...); padding may be -1 |
| `position_ids`    | (B, T) | positions; when None they count from 0 and restart at each instance of a packed row |

A token attends only to the tokens of its own instance, so a packed row gives exactly the hidden
states of its instances computed one by one. Attention runs per instance (`attention_plan`,
built once per batch from `sequence_ids` and `attention_mask`; in training the data loader
builds it, see `BatchLayout`): the instances are gathered into (instances, length) blocks
bucketed by length, so a packed row costs sum(n_k^2) rather than
T^2 and no T x T block-diagonal mask (nor its dropout draws) is made. Dense batches without
padding skip the gathering and call SDPA without a mask, so it may pick its fused kernel.
In training on CPU, dropout draws a cheaper mask of the same distribution (`keep_mask`): on the
attention probabilities inside `attend` (SDPA's dropout on CPU takes its slow math path), and
on the residual branches fused with the residual add (`Dropout.add_to`).

The field names of `BertConfig` are those of the reference `bert_config.json` (and of
`transformers.BertConfig`), so a Hugging Face `config.json` reads directly.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

PADDING_SEQUENCE_ID = -1


@dataclass(frozen=True)
class BertConfig:
    """Shape and regularisation of a BERT encoder."""

    vocab_size: int = 30522
    """Number of WordPiece tokens (rows of the word embedding and of the tied MLM decoder)."""
    hidden_size: int = 768
    """Width H of every hidden state."""
    num_hidden_layers: int = 12
    """Number L of Transformer blocks."""
    num_attention_heads: int = 12
    """Number A of attention heads; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer (4H in the paper)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: "gelu" (exact, erf) or "gelu_new"/"gelu_pytorch_tanh" (tanh approximation)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings, attention output, feed-forward output and the classifier."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Number of learned positions (the longest row)."""
    type_vocab_size: int = 2
    """Number of token types (segments A and B)."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (the reference uses 1e-12)."""
    pad_token_id: int = 0
    """Id of `[PAD]`."""
    stock_dropout: bool = False
    """Dropout through torch's stock ops (F.dropout, SDPA's dropout, whole-row attention masks)
    instead of the faster CPU paths: the same distribution either way, but only these draw the
    very random numbers transformers' BERT draws for a seed (for run-for-run parity checks)."""

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} not in {sorted(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} outside the vocabulary")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BertConfig:
        """Our fields from a dict; other keys (e.g. of a Hugging Face config.json) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)


def bert_tiny(**changes: Any) -> BertConfig:
    """L=2, H=128, A=2 (Turc et al. 2019 BERT-Tiny): tests and the demo."""
    return BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512, **changes)


def bert_mini(**changes: Any) -> BertConfig:
    """L=4, H=256, A=4 (Turc et al. 2019 BERT-Mini)."""
    return BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, **changes)


def bert_base(**changes: Any) -> BertConfig:
    """L=12, H=768, A=12: BERT-base, 110M parameters with the 30522-token vocabulary."""
    return BertConfig(**changes)


def bert_large(**changes: Any) -> BertConfig:
    """L=24, H=1024, A=16: BERT-large, 335M parameters with the 30522-token vocabulary."""
    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096, **changes)


PRESETS = {"bert_tiny": bert_tiny, "bert_mini": bert_mini, "bert_base": bert_base,
           "bert_large": bert_large}

ACTIVATIONS = {  # functions, not lambdas: a model must stay picklable
    "gelu": F.gelu,
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def packed_position_ids(sequence_ids: Tensor) -> Tensor:
    """Positions restarting at 0 at each instance boundary of a row. (B, T) -> (B, T)

    The torch twin of `pipelines.shard_format.position_ids`.
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


class Dropout(nn.Dropout):
    """`nn.Dropout` with a cheaper mask of the same distribution on CPU (`dropout`, `keep_mask`),
    and `add_to` for the residual connections, which adds the dropped-out x in the same pass.

    A subclass, so code that finds dropout modules by type still finds these.
    `stock=True`: `F.dropout`.
    """

    def __init__(self, p: float, stock: bool = False):
        super().__init__(p)
        self.stock = stock

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        return F.dropout(x, self.p) if self.stock else dropout(x, self.p)

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + dropout(x), on CPU in one pass (`addcmul`: residual + x * keep / (1 - p),
        rounded once) rather than three (mask, scale, add) over (B, T, H)."""
        if not self.training or self.p == 0.0:
            return residual + x
        if self.stock or x.device.type != "cpu" or not keep_mask_resolves(self.p):
            return residual + self(x)
        return torch.addcmul(residual, x, keep_mask(x.shape, self.p, x.dtype),
                             value=1.0 / (1.0 - self.p))


DROPOUT_BITS = 16
"""Random bits per element of a CPU dropout mask: the drop probability is rounded to a multiple
of 2^-16 (BERT's 0.1 drops with probability 6554 / 65536 = 0.100006)."""


def keep_mask_resolves(p: float) -> bool:
    """Whether `keep_mask` can draw drop probability p: round(p * 2^16) is neither 0 nor 2^16.
    Closer to 0 or 1 the callers use torch's stock dropout, exact at any p."""
    return 0 < round(p * 2**DROPOUT_BITS) < 2**DROPOUT_BITS


def dropout(x: Tensor, p: float) -> Tensor:
    """Inverted dropout of `x` with drop probability p (any shape; see `keep_mask`): kept
    elements scaled by 1 / (1 - p), as in `F.dropout`.

    Off the CPU, `F.dropout` is one fused kernel already and is used as is.
    """
    if p == 0.0:
        return x
    if x.device.type != "cpu" or not keep_mask_resolves(p):
        return F.dropout(x, p)
    return _ApplyKeepMask.apply(x, keep_mask(x.shape, p, x.dtype), 1.0 / (1.0 - p))


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> Tensor:
    """1 where an element is kept, 0 where dropped, in `dtype` (CPU).

    Each element is kept iff a uniform 16-bit integer is >= round(p * 2^16). On CPU an int64
    from torch's generator costs little more than an int32 (the per-value overhead dominates),
    so the bits come as full-range int64 words cut into four int16s: 2.5-3.8x cheaper than an
    int32 per element (and `bernoulli_`, what `F.dropout` uses, draws a float per element). The
    comparison writes the mask in x's dtype directly: no bool -> float conversion later.
    """
    if not keep_mask_resolves(p):
        raise ValueError(f"drop probability {p} rounds to {round(p * 2**DROPOUT_BITS)} / 2^16: "
                         "use F.dropout")
    n = math.prod(shape)
    words = torch.empty(-(-n // 4), dtype=torch.int64).random_(-2**63, None)  # all 64 bits
    bits = words.view(torch.int16)[:n].view(shape)  # uniform on [-2^15, 2^15)
    threshold = -2**(DROPOUT_BITS - 1) + round(p * 2**DROPOUT_BITS)
    return torch.ge(bits, threshold, out=torch.empty(shape, dtype=dtype))


class _ApplyKeepMask(torch.autograd.Function):
    """x * keep * scale with `keep` the 0/1 mask in x's dtype; the gradient alike.

    A product with the mask, not `torch.where` on a bool mask: on CPU `where` and bool -> float
    conversion are scalar loops (~6x slower than a multiply here). (x * 1) * scale rounds once,
    as x * scale does: kept values are `where(keep, x * scale, 0)`'s. Dropped ones are x * 0, as
    in `F.dropout`: -0.0 for a negative x, NaN for an infinite one (a `where` would hide that
    overflow). The mask is what is saved (an element of x's size: 1 byte more per element in
    bf16 than a bool mask, 3 in fp32, for a forward and a backward without conversions).
    """

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep.to(grad.dtype)).mul_(ctx.scale), None, None


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, LayerNorm, dropout. (B, T) ids -> (B, T, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob, config.stock_dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float,
           stock: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) with dropout on the probabilities, times v.

    q (N, A, Tq, D), k and v (N, A, Tk, D) -> (N, A, Tq, D); mask broadcastable to
    (N, A, Tq, Tk), True = may attend. Without dropout this is SDPA (its fused kernel when there
    is no mask). With dropout, SDPA on CPU falls back to its math path, which draws a float per
    probability and upcasts bf16 to fp32 throughout; `attend_with_dropout` is faster (RESULTS
    4.4: 1.5-1.6x fp32, 2.0-2.3x bf16, per instance vs SDPA on masked rows) with a flash
    kernel's precision. `stock=True`: SDPA always.
    """
    if (stock or dropout_p == 0.0 or q.device.type != "cpu"  # GPU kernels fuse dropout
            or not keep_mask_resolves(dropout_p)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return attend_with_dropout(q, k, v, mask, dropout_p)


def attend_with_dropout(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                        dropout_p: float) -> Tensor:
    """`attend` on CPU, in the numerics of flash attention: scores and softmax in fp32, the
    probabilities (times `keep_mask`) in the input dtype for the product with v.

    Dropout's 1 / (1 - p) scales the output (Tq x D per head) rather than the probabilities
    (Tq x Tk): the same product, a pass over the largest tensor fewer in forward and backward.

    bf16 scores would double the output error of attention (1.0% vs SDPA's 0.5% here at
    512 tokens, tests/test_model.py). fp32 ones cost a fp32 matmul in the forward, and the
    scores and probabilities (N, A, Tq, Tk) are held in fp32 for the backward: twice the
    memory of that, the largest activation, in bf16.
    """
    q = q * q.shape[-1] ** -0.5
    if q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype:
        scores = _ScoresInFloat32.apply(q, k)  # (N, A, Tq, Tk) fp32
    else:  # fp32 or fp64: in their own precision
        scores = q @ k.transpose(-1, -2)  # (N, A, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1).to(v.dtype)
    if dropout_p == 0.0:
        return probs @ v
    return (probs * keep_mask(probs.shape, dropout_p, probs.dtype)) @ v * (1.0 / (1.0 - dropout_p))


class _ScoresInFloat32(torch.autograd.Function):
    """q k^T in fp32 from low-precision q, k (N, A, T, D); the backward in their dtype, as flash
    attention's: an fp32 backward would cost two fp32 matmuls for no gain in the gradients'
    precision, which the low-precision q and k bound anyway."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor) -> Tensor:
        ctx.save_for_backward(q, k)
        with torch.autocast(q.device.type, enabled=False):  # autocast would make it bf16 again
            return q.float() @ k.float().transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad_scores: Tensor) -> tuple[Tensor, Tensor]:
        q, k = ctx.saved_tensors
        grad = grad_scores.to(q.dtype)
        return grad @ k, grad.transpose(-1, -2) @ q


def split_heads(qkv: Tensor, num_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Fused projections (N, T, 3H) -> q, k, v, each (N, A, T, D)."""
    N, T, H3 = qkv.shape
    q, k, v = (qkv.view(N, T, 3, num_heads, H3 // (3 * num_heads))  # (N, T, 3, A, D)
               .permute(2, 0, 3, 1, 4)  # (3, N, A, T, D)
               .unbind(0))
    return q, k, v


@dataclass(frozen=True)
class InstanceGroup:
    """Instances of similar length that go through one attention call."""

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
    no attention dropout draws between instances; padding tokens get a zero attention output.
    """

    groups: tuple[InstanceGroup, ...]
    """Instances bucketed by length (each bucket padded to its longest member)."""
    slot_index: Tensor
    """(S,) every group's `index`, flattened and concatenated: one gather for all groups (its
    backward is then one scatter-add rather than one full-size gradient per group)."""
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
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]] | (np.arange(B * T) % T == 0))
    lengths = np.diff(np.r_[starts, B * T])
    keep = flat[starts] != PADDING_SEQUENCE_ID
    starts, lengths = starts[keep], lengths[keep]
    if len(starts) == B and (lengths == T).all():
        return None
    runs = np.stack([starts // T, flat[starts]], axis=1)  # (row, instance id) of every run
    if len(np.unique(runs, axis=0)) < len(runs):  # an instance in two runs
        return None
    device = ids.device
    buckets = -(-lengths // bucket)
    groups, order = [], []
    for b in np.unique(buckets):
        members = np.flatnonzero(buckets == b)
        n = int(lengths[members].max())
        offsets = np.arange(n)
        real = offsets[None, :] < lengths[members, None]  # (G, n)
        index = starts[members, None] + np.where(real, offsets[None, :], 0)  # (G, n)
        order.append(index[real])
        padded = not real.all()
        real_t = torch.from_numpy(real).to(device)
        groups.append(InstanceGroup(
            index=torch.from_numpy(index).to(device),
            key_mask=real_t[:, None, None, :] if padded else None,
            real=real_t if padded else None))
    if not groups:  # a batch of padding only
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return AttentionPlan((), empty, empty)
    slot_index = torch.cat([g.index.flatten() for g in groups])
    return AttentionPlan(tuple(groups), slot_index,
                         torch.from_numpy(np.concatenate(order)).to(device))


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
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> BatchLayout:
        """Page-locked copies (what a DataLoader with pin_memory=True asks of batch items)."""
        return self._map(Tensor.pin_memory)

    def _map(self, fn: Callable[[Tensor], Tensor]) -> BatchLayout:
        if self.plan is None:
            return self

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else fn(t)

        groups = tuple(InstanceGroup(move(g.index), move(g.key_mask), move(g.real))
                       for g in self.plan.groups)
        return BatchLayout(AttentionPlan(groups, move(self.plan.slot_index),
                                         move(self.plan.token_index)), self.masked)


def batch_layout(ids: Tensor | None) -> BatchLayout:
    """The `BatchLayout` of instance ids (B, T) (`instance_ids`), on the host."""
    if ids is None:
        return BatchLayout(None, masked=False)
    ids = ids.cpu()
    return BatchLayout(attention_plan(ids), masked=not one_instance_per_row(ids))


def attend_instances(qkv: Tensor, plan: AttentionPlan, num_heads: int,
                     dropout_p: float) -> Tensor:
    """Attention of every instance within itself. qkv (B, T, 3H) -> (B, T, H), 0 at padding."""
    B, T, H3 = qkv.shape
    slots = qkv.reshape(B * T, H3).index_select(0, plan.slot_index)  # (S, 3H)
    outputs = []
    for group, part in zip(plan.groups, slots.split([g.index.numel() for g in plan.groups])):
        q, k, v = split_heads(part.view(*group.index.shape, H3), num_heads)  # 3 x (G, A, n, D)
        y = attend(q, k, v, group.key_mask, dropout_p).transpose(1, 2).flatten(2)  # (G, n, H)
        outputs.append(y.flatten(0, 1) if group.real is None else y[group.real])  # (N_g, H)
    out = qkv.new_zeros(B * T, H3 // 3)
    if not outputs:  # a batch of padding only
        return out.view(B, T, H3 // 3)
    y = torch.cat(outputs)  # (N_real, H) in plan.token_index order
    return out.index_copy(0, plan.token_index, y).view(B, T, H3 // 3)  # (B*T, H) -> (B, T, H)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection. (B, T, H) -> (B, T, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.stock_dropout = config.stock_dropout

    def forward(self, x: Tensor, plan: AttentionPlan | None = None, mask: Tensor | None = None,
                query_index: Tensor | None = None) -> Tensor:
        """x (B, T, H) -> (B, T, H), or (B, P, H) for the queries at `query_index` (B, P) only.

        Attention runs per instance as `plan` says, else over whole rows under the boolean
        `mask` (B, 1, T or P, T) (None: every token sees every token of its row).
        """
        B, _, H = x.shape
        dropout_p = self.dropout_p if self.training else 0.0
        qkv = self.qkv(x)  # (B, T, 3H)
        if plan is not None and query_index is None:
            return self.out(attend_instances(qkv, plan, self.num_heads, dropout_p))
        q, k, v = split_heads(qkv, self.num_heads)  # 3 x (B, A, T, D)
        if query_index is not None:
            index = query_index[:, None, :, None].expand(-1, self.num_heads, -1, q.shape[-1])
            q = q.gather(2, index)  # (B, A, P, D)
        y = attend(q, k, v, mask, dropout_p, self.stock_dropout)  # (B, A, P, D)
        y = y.transpose(1, 2).reshape(B, -1, H)  # (B, P, H)
        return self.out(y)


class BertLayer(nn.Module):
    """One post-LayerNorm block: x = norm(x + attention(x)); x = norm(x + ffn(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob, config.stock_dropout)

    def forward(self, x: Tensor, plan: AttentionPlan | None = None, mask: Tensor | None = None,
                query_index: Tensor | None = None) -> Tensor:
        """x (B, T, H) -> (B, T, H), or (B, P, H) at `query_index` (B, P): every token is still
        attended to, but only the P queries go through attention output and feed-forward.
        `plan` and `mask` as in `BertSelfAttention.forward`."""
        residual = x if query_index is None else gather_positions(x, query_index)
        attended = self.attention(x, plan, mask, query_index)
        x = self.attention_norm(self.dropout.add_to(residual, attended))
        h = self.output(self.activation(self.intermediate(x)))
        return self.output_norm(self.dropout.add_to(x, h))


def gather_positions(hidden: Tensor, positions: Tensor) -> Tensor:
    """hidden (B, T, H) at positions (B, P) -> (B, P, H)."""
    return hidden.gather(1, positions.long()[:, :, None].expand(-1, -1, hidden.shape[-1]))


class BertPooler(nn.Module):
    """Dense + tanh on the `[CLS]` hidden state. (..., H) -> (..., H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_states: Tensor) -> Tensor:
        return torch.tanh(self.dense(cls_states))


@torch.no_grad()
def truncated_normal_(tensor: Tensor, std: float,
                      generator: torch.Generator | None = None) -> Tensor:
    """N(0, std) truncated at +-2 std (TF's `truncated_normal_initializer`), by inverse CDF.

    `nn.init.trunc_normal_` computes the same but is ~15x slower on CPU (seconds for BERT-base).
    """
    bound = math.erf(2 / math.sqrt(2))  # 2 * Phi(2) - 1
    tensor.uniform_(-bound, bound, generator=generator).erfinv_().mul_(std * math.sqrt(2))
    return tensor.clamp_(-2 * std, 2 * std)  # guards the float rounding at the bounds


def init_bert_weights(module: nn.Module, initializer_range: float) -> None:
    """BERT's initialisation: weights ~ N(0, 0.02) truncated at 2 std, biases 0, LayerNorm 1/0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        truncated_normal_(module.weight, initializer_range)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


@dataclass(frozen=True)
class HiddenStates:
    """Every layer's output, what `BertModel.forward(..., output_hidden_states=True)` returns."""

    layers: tuple[Tensor, ...]
    """L + 1 tensors (B, T, H): the embeddings' output, then each block's (the last is the
    default return), as transformers' `hidden_states`."""

    @property
    def last(self) -> Tensor:
        """(B, T, H) the last block's output."""
        return self.layers[-1]


class BertModel(nn.Module):
    """The encoder: embeddings, `num_hidden_layers` blocks, and a pooler used through `pool`."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = BertPooler(config)
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, sequence_ids: Tensor | None = None,
                position_ids: Tensor | None = None,
                output_positions: Tensor | None = None,
                layout: BatchLayout | None = None,
                output_hidden_states: bool = False) -> Tensor | HiddenStates:
        """Last hidden states (B, T, H); see the module docstring for the (B, T) inputs.

        With `output_positions` (B, P) only the states at those positions (B, P, H) are
        returned, and the last layer computes attention output and feed-forward for those P
        tokens only (pre-training needs the masked positions and the [CLS]s: ~15% of tokens).
        `layout`: the batch's `BatchLayout` from the data loader; made here when None.
        `output_hidden_states`: every layer's states as `HiddenStates` (feature extraction,
        paper section 5.3); not with `output_positions`.
        """
        if output_hidden_states and output_positions is not None:
            raise ValueError("output_hidden_states gives every token's states: no output_positions")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"rows of {input_ids.shape[1]} tokens exceed "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = (packed_position_ids(sequence_ids) if sequence_ids is not None
                            else torch.arange(input_ids.shape[1], device=input_ids.device)
                            .expand_as(input_ids))
        ids = instance_ids(attention_mask, sequence_ids, input_ids)
        layout = batch_layout(ids) if layout is None else layout
        # stock dropout draws its masks over whole rows, as transformers' BERT does
        plan = None if self.config.stock_dropout else layout.plan
        whole_rows = plan is None and layout.masked  # instances not in single runs, or stock
        mask = query_attention_mask(ids, None) if whole_rows else None
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        if output_hidden_states:
            states = [x]
            for layer in self.layers:
                states.append(layer(states[-1], plan, mask))
            return HiddenStates(tuple(states))
        for layer in self.layers[:-1]:
            x = layer(x, plan, mask)
        if output_positions is None:
            return self.layers[-1](x, plan, mask)
        # The sparse last layer attends from P queries over whole rows: a (B, 1, P, T) mask is
        # small, and per-instance groups would need the queries sorted into them.
        query_index = output_positions.long()
        query_mask = query_attention_mask(ids, query_index) if layout.masked else None
        return self.layers[-1](x, mask=query_mask, query_index=query_index)

    def pool(self, hidden: Tensor, cls_positions: Tensor | None = None) -> Tensor:
        """Pooled `[CLS]` states: (B, T, H) -> (B, H) at position 0, or (B, K, H) at `cls_positions` (B, K)."""
        if cls_positions is None:
            return self.pooler(hidden[:, 0])
        return self.pooler(gather_positions(hidden, cls_positions.clamp(min=0)))  # (B, K, H)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
