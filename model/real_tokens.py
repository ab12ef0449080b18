"""ModernBERT's layers on the real tokens of a batch (`RealTokens`), as transformers' ModernBERT
unpads for flash attention and MosaicBERT keeps `bert_padding.py` beside its model: which tokens
the layers hold, and attention over them per instance.

The real tokens are gathered once before the embeddings and held as one (N, H) matrix through
every norm, projection and feed-forward; attention runs per instance. On the CPU: one
`scaled_dot_product_attention` call per bucket of instances of similar length
(`attend_buckets`, from model/attention.py's plan; full rows are one bucket), local layers of
buckets longer than `CHUNKED_WINDOWS` windows in chunks of w queries against the 3w keys around
them (`attend_band`: O(n w), not O(n^2) under an n x n mask). On a GPU with fp16/bf16
activations and no attention dropout: torch's variable-length FlashAttention kernel
(`varlen_attention` over `TokenRuns`), not exercised by the CPU tests. When the layers take
this path, and when they take whole rows instead, is model/modernbert.py's
`ModernBertModel.real_tokens`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from model.attention import AttentionPlan, window_mask
from model.cpu_ops import attend


@dataclass(frozen=True)
class TokenRuns:
    """The real tokens of a batch as one run per instance, for torch's variable-length
    attention kernel (`varlen_attention`)."""

    token_index: Tensor
    """(N,) flat index (row * T + position) of every real token, instance after instance."""
    cu_seqlens: Tensor
    """(runs + 1,) int32 start of each run in those N tokens, then N."""
    max_length: int
    """Length of the longest run."""


def token_runs(ids: Tensor | None, rows: int, length: int, device: torch.device) -> TokenRuns:
    """Runs of equal instance id within a row (padding -1 left out), from ids (B, T) or None
    (every row one instance). Asks the device for the run lengths (one sync per forward)."""
    if ids is None:
        token_index = torch.arange(rows * length, device=device)
        starts = torch.arange(0, rows * length, length, device=device)
    else:
        flat = ids.reshape(-1)
        token_index = (flat >= 0).nonzero().squeeze(1)  # (N,)
        run, row = flat[token_index], token_index // length
        new = torch.ones_like(token_index, dtype=torch.bool)
        new[1:] = (run[1:] != run[:-1]) | (row[1:] != row[:-1])
        starts = new.nonzero().squeeze(1)
    total = torch.tensor([token_index.numel()], device=device)
    cu_seqlens = torch.cat([starts, total]).int()
    return TokenRuns(token_index, cu_seqlens, int(cu_seqlens.diff().max()) if len(starts) else 0)


@dataclass(frozen=True)
class InstanceBucket:
    """Instances of similar length that attend in one SDPA call: G of them, n slots each."""

    shape: tuple[int, int]
    """(G, n)."""
    real: Tensor | None
    """(G, n) True at the instance's own tokens (a slot past its end repeats the instance's
    first token); None when all G instances have n tokens."""


@dataclass(frozen=True)
class RealTokens:
    """The real tokens of a batch, which every layer but a sparse last one holds as one (N, H)
    matrix: embeddings, norms, projections and feed-forward do no work on padding, and
    attention runs per instance (local layers in chunks of their window, `attend_band`). As
    transformers' ModernBERT unpads for flash attention (and MosaicBERT's `bert_padding.py`),
    here on the CPU too."""

    token_index: Tensor
    """(N,) flat index (row * T + position) of every real token, in the order the layers hold
    them."""
    rows: int
    """B."""
    length: int
    """T."""
    buckets: tuple[InstanceBucket, ...] = ()
    """CPU: the instances by length bucket (model/attention.py `attention_plan`)."""
    slots: Tensor | None = None
    """(S,) the token (0..N-1) in each slot of the buckets, bucket after bucket; None when the
    slots are the N tokens in order (no bucket has a slot past an instance's end)."""
    real_slots: Tensor | None = None
    """(N,) the slot of each token; None with `slots`."""
    runs: TokenRuns | None = None
    """GPU: the instances as runs for the variable-length kernel (no buckets then)."""
    every_token: bool = False
    """Rows of one instance each, without padding: gathering and padding are reshapes."""

    @staticmethod
    def of_rows(rows: int, length: int, device: torch.device) -> RealTokens:
        """Full rows, one instance each: one bucket of B rows (for chunked local attention)."""
        return RealTokens(torch.arange(rows * length, device=device), rows, length,
                          (InstanceBucket((rows, length), None),), every_token=True)

    @staticmethod
    def of_plan(plan: AttentionPlan, rows: int, length: int) -> RealTokens:
        """The tokens of `plan` (made on the host), in the order its buckets return them."""
        slots = None
        if plan.real_slots is not None:  # slot -> token: through a (B T,) map of token order
            order = torch.empty(rows * length, dtype=torch.long, device=plan.token_index.device)
            order[plan.token_index] = torch.arange(plan.token_index.numel(), device=order.device)
            slots = order[plan.slot_index]
        buckets = tuple(InstanceBucket(tuple(g.index.shape), g.real) for g in plan.groups)
        return RealTokens(plan.token_index, rows, length, buckets, slots, plan.real_slots)

    def gather(self, t: Tensor) -> Tensor:
        """The real tokens of (B, T, ...) -> (N, ...)."""
        if self.every_token:
            return t.reshape(self.rows * self.length, *t.shape[2:])
        return t.reshape(self.rows * self.length, *t.shape[2:]).index_select(0, self.token_index)

    def pad(self, t: Tensor) -> Tensor:
        """(N, C) -> (B, T, C), zeros at padding."""
        if self.every_token:
            return t.view(self.rows, self.length, -1)
        out = t.new_zeros(self.rows * self.length, t.shape[-1])
        return out.index_copy(0, self.token_index, t).view(self.rows, self.length, -1)


@dataclass(frozen=True)
class RealInputs:
    """What every layer of one kind attends with when it runs on `RealTokens`."""

    cos: Tensor
    """(N, D) cosines of the RoPE angles at this kind's theta."""
    sin: Tensor
    """(N, D) sines."""
    masks: tuple[Tensor | None, ...]
    """Per bucket, True = may attend, or None (CPU): (G, 1, n or 1, n), or for a banded bucket
    (`banded`) (G K, 1, w, 3w)."""
    banded: tuple[bool, ...]
    """Per bucket, whether it attends in chunks of `window` queries (`attend_band`)."""
    window: int | None
    """Tokens seen each side on local layers; None on global ones."""
    tokens: RealTokens


def bucket_mask(bucket: InstanceBucket, window: int | None,
                device: torch.device) -> Tensor | None:
    """(G, 1, n or 1, n) mask of one bucket: keys of the instance itself, within `window` each
    side on local layers. A slot past an instance's end sees all of it (its output is dropped;
    a query that saw nothing would make SDPA's softmax NaN)."""
    n = bucket.shape[1]
    near = None if window is None else window_mask(n, window, device)  # (1, 1, n, n)
    if bucket.real is None:
        return near
    keys = bucket.real[:, None, None, :]  # (G, 1, 1, n)
    return keys if near is None else keys & (near | ~bucket.real[:, None, :, None])


CHUNKED_WINDOWS = 16
"""A local layer attends in chunks (`attend_band`) in buckets more than this many windows long.
Shorter ones take one n x n product under a mask: there it costs little, and the chunks' extra
copies and small products (a dozen more ops a layer, forward and backward) cost about as much,
more on a busy 2-core CPU (tiny model, 4 x 512 padded, one thread: 0.56 s a step with chunks
at 512 tokens, 0.52 s without; RESULTS 21)."""


def uses_band(bucket: InstanceBucket, window: int | None) -> bool:
    """Whether a local layer attends in chunks (`attend_band`) in this bucket."""
    return window is not None and bucket.shape[1] > CHUNKED_WINDOWS * window


def band_mask(bucket: InstanceBucket, window: int, device: torch.device) -> Tensor:
    """(G K, 1, w, 3w) mask of `attend_band`'s K chunks of w = `window` queries against the 3w
    keys around each (from w before the chunk to w after it): within the window, keys of the
    instance itself. A query past the instance's end sees its whole 3w (its output is dropped;
    one that saw nothing would make SDPA's softmax NaN)."""
    (G, n), w = bucket.shape, window
    K = -(-n // w)
    real = (torch.ones(G, n, dtype=torch.bool, device=device) if bucket.real is None
            else bucket.real)
    keys = F.pad(real, (w, K * w - n + w)).unfold(1, 3 * w, w)  # (G, K, 3w)
    queries = F.pad(real, (0, K * w - n)).view(G, K, w, 1)
    offsets = torch.arange(3 * w, device=device)
    near = (torch.arange(w, device=device)[:, None] + w - offsets).abs() <= w  # (w, 3w)
    return ((near & keys[:, :, None, :]) | ~queries).view(G * K, 1, w, 3 * w)


def attend_band(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, window: int,
                dropout_p: float) -> Tensor:
    """Local attention in chunks: each chunk of w = `window` queries against the 3w keys from
    w before it to w after it, which hold every key its queries may see. q, k, v (G, n, A, D)
    -> (G, n, A D). At n = 2,048 and w = 64 that is 192 keys per query instead of 2,048
    under a mask: ModernBERT's local layers then cost O(n w), not O(n^2)."""
    (G, n, A, D), w = q.shape, window
    K = -(-n // w)
    q = F.pad(q, (0, 0, 0, 0, 0, K * w - n)).view(G, K, w, A, D)
    q = q.permute(0, 1, 3, 2, 4).reshape(G * K, A, w, D)

    def around(t: Tensor) -> Tensor:  # (G, n, A, D) -> (G K, A, 3w, D), w zeros at each end
        windows = F.pad(t, (0, 0, 0, 0, w, K * w - n + w)).unfold(1, 3 * w, w)  # (G,K,A,D,3w)
        return windows.permute(0, 1, 2, 4, 3).reshape(G * K, A, 3 * w, D)

    y = attend(q, around(k), around(v), mask, dropout_p)  # (G K, A, w, D)
    y = y.view(G, K, A, w, D).permute(0, 1, 3, 2, 4).reshape(G, K * w, A * D)
    return y[:, :n]


def attend_buckets(q: Tensor, k: Tensor, v: Tensor, inputs: RealInputs,
                   dropout_p: float) -> Tensor:
    """Attention per bucket of instances: q, k, v (N, A, D) -> (N, A D)."""
    tokens = inputs.tokens
    A, D = q.shape[1:]
    if tokens.slots is not None:
        q, k, v = (t.index_select(0, tokens.slots) for t in (q, k, v))  # (S, A, D)
    sizes = [G * n for G, n in (b.shape for b in tokens.buckets)]
    outputs = []
    for bucket, mask, banded, *qkv in zip(tokens.buckets, inputs.masks, inputs.banded,
                                          q.split(sizes), k.split(sizes), v.split(sizes)):
        G, n = bucket.shape
        qb, kb, vb = (t.view(G, n, A, D) for t in qkv)
        if banded:
            y = attend_band(qb, kb, vb, mask, inputs.window, dropout_p)  # (G, n, A D)
        else:
            y = attend(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2), mask,
                       dropout_p).transpose(1, 2)  # (G, A, n, D) -> (G, n, A, D)
        outputs.append(y.reshape(G * n, A * D))
    y = outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (S, A D)
    return y if tokens.real_slots is None else y.index_select(0, tokens.real_slots)


def half_precision_attention(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether q, k and v will be fp16 or bf16 (the flash kernels take no other): the hidden
    states' `dtype` is, or autocast makes the projections so."""
    half = (torch.float16, torch.bfloat16)
    return dtype in half or (torch.is_autocast_enabled(device.type)
                             and torch.get_autocast_dtype(device.type) in half)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, runs: TokenRuns,
                     window: int | None) -> Tensor:
    """Attention within each run of `runs` (and within `window` each side) by torch's
    variable-length FlashAttention kernel (`torch.nn.attention.varlen`, torch >= 2.10; CUDA,
    fp16/bf16, no dropout): q, k, v (N, A, D) -> (N, A, D). Not run by the CPU tests."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, runs.cu_seqlens, runs.cu_seqlens, runs.max_length,
                       runs.max_length,
                       window_size=(-1, -1) if window is None else (window, window))
