"""Dropout on CPU: the 16-bit mask's distribution, scaling, residual and attention dropout, and the
CPU dropout-attention kernel against SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.bert import bert_tiny
from model.cpu_ops import Dropout, attend, dropout, keep_mask, stock_ops


def test_dropout_has_the_distribution_of_f_dropout():
    torch.manual_seed(0)
    x = torch.ones(1_000_000)
    y = dropout(x, 0.1)
    # inverted dropout: kept values scaled by 1 / (1 - p), as F.dropout does
    assert y.unique().tolist() == [0.0, torch.tensor(1 / 0.9).item()]
    # keep share 0.9: 1e6 draws have a standard deviation of 0.0003; 0.002 is ~6.7 of them,
    # and each half of the tensor alone must be right too (no position dependence)
    for part in (y[:500_000], y[500_000:]):
        assert abs((part != 0).float().mean().item() - 0.9) < 0.002
    assert dropout(x, 0.0) is x
    module = Dropout(0.1)
    assert isinstance(module, torch.nn.Dropout)  # fine-tuning code switches nn.Dropout off by type
    assert module.eval()(x) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_output_and_gradient_are_the_kept_values_scaled_once(dtype):
    """Kept elements are x * (1 / (1 - p)) rounded once in x's dtype (a bf16 factor would round
    twice), dropped ones 0; the gradient likewise. Same values as `torch.where` on the mask."""
    x = torch.randn(4, 64, 96, dtype=dtype, requires_grad=True)
    grad = torch.randn(4, 64, 96, dtype=dtype)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    (x_grad,) = torch.autograd.grad(y, x, grad)
    torch.manual_seed(3)  # the same draws: 16 bits per element, kept iff >= p * 2^16
    words = torch.empty(4 * 64 * 96 // 4, dtype=torch.int64).random_(-2**63, None)
    keep = words.view(torch.int16).view(x.shape) >= -2**15 + 6554
    assert torch.equal(y, torch.where(keep, x.detach() * (1 / 0.9), 0.0))  # -0.0 == 0.0
    assert torch.equal(x_grad, torch.where(keep, grad * (1 / 0.9), 0.0))
    assert 0.88 < keep.float().mean().item() < 0.92
    # as F.dropout: a dropped inf is inf * 0 = NaN (an overflow shows; a `where` would hide it)
    torch.manual_seed(3)
    overflowed = dropout(torch.full((64,), float("inf"), dtype=dtype), 0.5)
    assert overflowed.isnan().any() and overflowed.isinf().any()
    assert (overflowed.isnan() | overflowed.isinf()).all()


def test_residual_dropout_adds_the_dropped_out_branch_in_one_rounding():
    """Dropout.add_to(residual, x) is residual + dropout(x): the same draws, kept values of x
    scaled by 1 / (1 - p); in fp32 bit for bit, and its gradients are the mask's."""
    module = Dropout(0.1).train()
    residual = torch.randn(4, 32, 48, requires_grad=True)
    x = torch.randn(4, 32, 48, requires_grad=True)
    grad = torch.randn(4, 32, 48)
    torch.manual_seed(5)
    fused = module.add_to(residual, x)
    fused_grads = torch.autograd.grad(fused, (residual, x), grad)
    torch.manual_seed(5)
    keep = keep_mask(x.shape, 0.1, x.dtype)
    assert torch.equal(fused, residual + torch.where(keep.bool(), x * (1 / 0.9), 0.0))
    assert torch.equal(fused_grads[0], grad)
    assert torch.equal(fused_grads[1], torch.where(keep.bool(), grad * (1 / 0.9), 0.0))
    assert 0.88 < keep.mean().item() < 0.92
    assert torch.equal(module.eval().add_to(residual, x), residual + x)  # eval: no dropout
    torch.manual_seed(5)
    expected = residual + F.dropout(x, 0.1)
    torch.manual_seed(5)
    with stock_ops():
        assert torch.equal(module.train().add_to(residual, x), expected)  # stock: F.dropout's own draws


def test_attention_dropout_drops_probabilities_and_rescales_the_output():
    """attend_with_dropout(p) = (softmax(q k^T / sqrt(D)) * keep) v / (1 - p), with the mask of
    `keep_mask` over (N, A, Tq, Tk): a dropped probability is one key unseen by one query."""
    from model.cpu_ops import attend_with_dropout

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 1, 40, 40, dtype=torch.bool)
    mask[1, :, :, 30:] = False
    torch.manual_seed(9)
    ours = attend_with_dropout(q, k, v, mask, 0.25)
    torch.manual_seed(9)
    keep = keep_mask(torch.Size((2, 3, 40, 40)), 0.25, torch.float64)
    probs = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    torch.testing.assert_close(ours, (probs * keep) @ v / 0.75)
    assert 0.72 < keep.mean().item() < 0.78
    torch.testing.assert_close(attend_with_dropout(q, k, v, mask, 0.0), probs @ v)


def test_a_layer_drops_out_both_residual_branches():
    """BertLayer in training: norm(x + dropout(attention(x))), then norm(. + dropout(ffn(.))),
    the two masks drawn in that order (attention-probability dropout off here)."""
    from model.bert import BertLayer

    torch.manual_seed(0)
    layer = BertLayer(bert_tiny(attention_probs_dropout_prob=0.0)).train()
    x = torch.randn(2, 16, 128)
    torch.manual_seed(4)
    out = layer(x)
    torch.manual_seed(4)
    keep_attention, keep_ffn = (keep_mask(x.shape, 0.1, x.dtype) for _ in range(2))
    with torch.no_grad():
        mid = layer.attention_norm(x + layer.attention(x) * keep_attention / 0.9)
        ffn = layer.output(layer.activation(layer.intermediate(mid)))
        expected = layer.output_norm(mid + ffn * keep_ffn / 0.9)
        no_dropout = layer.eval()(x)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, no_dropout, atol=1e-2)


@pytest.mark.parametrize("p", [2**-18, 1 - 2**-18])
def test_dropout_probabilities_the_16_bit_mask_cannot_draw_use_torchs_dropout(p):
    """round(p * 2^16) would be 0 (no drop at all) or 2^16 (a threshold past int16's range:
    everything kept, scaled by 1 / (1 - p)); there the CPU paths fall back to torch's own."""
    x, residual = torch.ones(100_000), torch.zeros(100_000)
    with pytest.raises(ValueError, match="use F.dropout"):
        keep_mask(x.shape, p, x.dtype)
    for ours, stock in [(lambda: dropout(x, p), lambda: F.dropout(x, p)),
                        (lambda: Dropout(p).train().add_to(residual, x),
                         lambda: residual + F.dropout(x, p))]:
        torch.manual_seed(1)
        got = ours()
        torch.manual_seed(1)
        assert torch.equal(got, stock())
    q = k = v = torch.randn(1, 2, 8, 4)
    torch.manual_seed(1)
    got = attend(q, k, v, None, p)
    torch.manual_seed(1)
    assert torch.equal(got, F.scaled_dot_product_attention(q, k, v, dropout_p=p))


def test_cpu_dropout_attention_has_the_precision_of_sdpas_fused_kernel():
    """bf16 under autocast, 512 tokens: our dropout path (here at p=0, so comparable) keeps
    scores and softmax in fp32 as flash attention does; its error against fp64 is SDPA's."""
    from model.cpu_ops import attend_with_dropout

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 512, 64, generator=g) * s for s in (1.5, 1.5, 1.0))
    mask = torch.ones(2, 1, 512, 512, dtype=torch.bool)
    mask[1, :, :, 400:] = False
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)

    def error(fn) -> float:
        qb, kb, vb = (x.bfloat16().requires_grad_() for x in (q, k, v))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fn(qb, kb, vb)
        assert out.dtype == torch.bfloat16
        return ((out.double() - exact).norm() / exact.norm()).item()

    ours = error(lambda q, k, v: attend_with_dropout(q, k, v, mask, 0.0))
    sdpa = error(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert ours < 1.1 * sdpa, (ours, sdpa)
    assert 0.004 < sdpa < 0.006  # bf16 rounding of the inputs and output alone: ~0.5%


def test_cpu_dropout_attention_gradients_match_fp32():
    from model.cpu_ops import attend_with_dropout

    g = torch.Generator().manual_seed(1)
    q, k, v, grad_out = (torch.randn(2, 4, 96, 32, generator=g) for _ in range(4))

    def grads(fn, dtype) -> list[torch.Tensor]:
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        fn(*leaves).backward(grad_out.to(dtype))
        return [x.grad.float() for x in leaves]

    exact = grads(F.scaled_dot_product_attention, torch.float64)
    ours32 = grads(lambda *qkv: attend_with_dropout(*qkv, None, 0.0), torch.float32)
    ours16 = grads(lambda *qkv: attend_with_dropout(*qkv, None, 0.0), torch.bfloat16)
    sdpa16 = grads(F.scaled_dot_product_attention, torch.bfloat16)
    for name, a, b, c, ref in zip("qkv", ours32, ours16, sdpa16, exact):
        torch.testing.assert_close(a, ref.float(), rtol=1e-4, atol=1e-5)
        ours_error = ((b - ref).norm() / ref.norm()).item()
        sdpa_error = ((c - ref).norm() / ref.norm()).item()
        assert ours_error < 1.25 * sdpa_error, (name, ours_error, sdpa_error)  # bf16 scores: 1.3x
    small = [x[:1, :1, :6, :4].double().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *qkv: attend_with_dropout(*qkv, None, 0.0), small)
