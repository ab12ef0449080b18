"""Dropout and attention ops that are faster on CPU than torch's stock ones, with the same
distribution and a flash kernel's precision; off the CPU each is torch's stock op.

- `dropout`, `Dropout`: a 16-bit integer keep mask (`keep_mask`) instead of `bernoulli_`'s float
  per element, applied through `_ApplyKeepMask` (a product, not a `where`); `Dropout.add_to`
  adds the dropped-out branch to the residual in one pass.
- `attend`: attention with dropout on the probabilities; on CPU `attend_with_dropout` (scores
  and softmax in fp32 through `_ScoresInFloat32`, the probabilities in the input dtype), since
  SDPA's dropout on CPU takes its slow math path.
- `stock_ops()`: a context in which all of these (and the per-instance attention of
  model/bert.py) step aside for torch's stock ops, which draw the very random numbers
  transformers' BERT draws for a seed: run-for-run parity checks use it.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_STOCK_OPS = False


@contextlib.contextmanager
def stock_ops() -> Iterator[None]:
    """Within this context the model uses torch's stock ops only: `F.dropout`, SDPA's dropout
    and whole-row attention masks (no per-instance attention), as transformers' BERT does."""
    global _STOCK_OPS
    previous, _STOCK_OPS = _STOCK_OPS, True
    try:
        yield
    finally:
        _STOCK_OPS = previous


def stock_ops_enabled() -> bool:
    """Whether the current code runs inside `stock_ops()`."""
    return _STOCK_OPS


DROPOUT_BITS = 16
"""Random bits per element of a CPU dropout mask: the drop probability is rounded to a multiple
of 2^-16 (BERT's 0.1 drops with probability 6554 / 65536 = 0.100006)."""


def keep_mask_resolves(p: float) -> bool:
    """Whether `keep_mask` can draw drop probability p: round(p * 2^16) is neither 0 nor 2^16.
    Closer to 0 or 1 the callers use torch's stock dropout, exact at any p."""
    return 0 < round(p * 2**DROPOUT_BITS) < 2**DROPOUT_BITS


def use_keep_mask(x: Tensor, p: float) -> bool:
    """Whether dropout of `x` at p takes the 16-bit CPU mask rather than `F.dropout`: not on a
    GPU (its kernel is fused already), not for a p the mask cannot draw, not in `stock_ops()`,
    and not under torch.compile (the generated kernel draws its own random numbers in place,
    the cost this mask exists to cut in eager mode)."""
    return (x.device.type == "cpu" and keep_mask_resolves(p) and not _STOCK_OPS
            and not torch.compiler.is_compiling())


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


def dropout(x: Tensor, p: float) -> Tensor:
    """Inverted dropout of `x` with drop probability p (any shape; see `keep_mask`): kept
    elements scaled by 1 / (1 - p), as in `F.dropout`.

    Off the CPU, `F.dropout` is one fused kernel already and is used as is.
    """
    if p == 0.0:
        return x
    if not use_keep_mask(x, p):
        return F.dropout(x, p)
    return _ApplyKeepMask.apply(x, keep_mask(x.shape, p, x.dtype), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` with a cheaper mask of the same distribution on CPU (`dropout`), and
    `add_to` for the residual connections, which adds the dropped-out x in the same pass.

    A subclass, so code that finds dropout modules by type still finds these.
    """

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p) if self.training else x

    def add_to(self, residual: Tensor, x: Tensor) -> Tensor:
        """residual + dropout(x), on CPU in one pass (`addcmul`: residual + x * keep / (1 - p),
        rounded once) rather than three (mask, scale, add) over (B, T, H)."""
        if not self.training or self.p == 0.0:
            return residual + x
        if not use_keep_mask(x, self.p):
            return residual + self(x)
        return torch.addcmul(residual, x, keep_mask(x.shape, self.p, x.dtype),
                             value=1.0 / (1.0 - self.p))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) with dropout on the probabilities, times v.

    q (N, A, Tq, D), k and v (N, A, Tk, D) -> (N, A, Tq, D); mask broadcastable to
    (N, A, Tq, Tk), True = may attend. Without dropout this is SDPA (its fused kernel when there
    is no mask). With dropout, SDPA on CPU falls back to its math path, which draws a float per
    probability and upcasts bf16 to fp32 throughout; `attend_with_dropout` is faster (RESULTS
    4.4: 1.5-1.6x fp32, 2.0-2.3x bf16, per instance vs SDPA on masked rows) with a flash
    kernel's precision. GPU kernels fuse dropout: SDPA there.
    """
    if dropout_p == 0.0 or not use_keep_mask(q, dropout_p):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    return attend_with_dropout(q, k, v, mask, dropout_p)


def attend_with_dropout(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                        dropout_p: float) -> Tensor:
    """`attend` on CPU, in the numerics of flash attention: scores and softmax in fp32, the
    probabilities (times `keep_mask`) in the input dtype for the product with v.

    Dropout's 1 / (1 - p) scales the output (Tq x D per head) rather than the probabilities
    (Tq x Tk): the same product, a pass over the largest tensor fewer in forward and backward.

    bf16 scores would double the output error of attention (1.0% vs SDPA's 0.5% here at
    512 tokens, tests/model/test_dropout.py). fp32 ones cost a fp32 matmul in the forward, and the
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
