"""The training step's GPU readiness, checked on CPU: no host-device syncs in a forward and
backward of loader-made batches, the one-call variable-length attention equal to the dense
masked computation, and an encoder layer that torch.compile traces without graph breaks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.attention import (
    attend_instances,
    attend_varlen,
    attention_mask_4d,
    attention_plan,
    split_heads,
)
from model.bert import bert_tiny
from model.heads import BertForPreTraining
from tests.model.tiny_models import VOCAB, shard_row
from training.loader import collate
from training.sync_check import SyncCounter

BATCHES = {  # what the shard loader's collate makes of padded and of packed rows
    "padded": [[20], [13], [37]],
    "packed": [[9, 12], [7], [40, 3, 20]],
    "dense": [[16], [16]],
}


def test_the_counter_sees_the_syncs_the_old_attention_made():
    """Boolean indexing and its backward (the old `y[group.real]`), `.item()` and `nonzero`
    are what the counter exists to catch."""
    x = torch.randn(4, 3, requires_grad=True)
    with SyncCounter() as counter:
        x[x[:, 0] > 0].sum().backward()
        (x.sum() > 0).item()
        torch.nonzero(x)
    assert counter.ops == ["index (boolean index)", "index_put (boolean index)",
                           "_local_scalar_dense", "nonzero"]


@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_a_training_step_makes_no_host_device_sync(kind):
    """forward + backward in training mode (dropout on) on a loader-made batch: every index
    comes from the host-made plan (`BatchLayout`), so on a GPU the step never waits."""
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB)).train()
    batch = collate([shard_row(lengths, seed) for seed, lengths in enumerate(BATCHES[kind])])
    assert (batch["layout"].plan is not None) == (kind != "dense")
    with SyncCounter() as counter:
        out = model(**batch)
        out.loss.backward()
    assert counter.ops == []
    assert all(p.grad is not None for p in model.parameters())


IDS = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 2],
                    [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # CPU math path
def test_one_variable_length_call_equals_the_block_diagonal_mask():
    """`attend_varlen` (each run of tokens a sequence of a jagged nested tensor; on a GPU
    SDPA's flash or memory-efficient kernel) against SDPA under the (B, 1, T, T) mask, fp64:
    real tokens' outputs and the gradients through them agree to rounding."""
    torch.manual_seed(0)
    plan = attention_plan(IDS, bucket=4)
    assert plan.run_offsets.tolist() == [0, 5, 8, 10, 16, 17, 28, 32]  # padding runs included
    assert (plan.min_run, plan.max_run) == (1, 11)
    qkv = torch.randn(2, 16, 3 * 8, dtype=torch.float64, requires_grad=True)  # A = 2, D = 4
    real = (IDS >= 0)[..., None]
    grad = torch.randn(2, 16, 8, dtype=torch.float64) * real

    def masked(qkv):
        q, k, v = split_heads(qkv, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_4d(IDS))
        return y.transpose(1, 2).reshape(2, 16, 8)  # (B, A, T, D) -> (B, T, H)

    outputs, grads = [], []
    for fn in (lambda x: attend_varlen(x, plan, 2, 0.0), masked,
               lambda x: attend_instances(x, plan, 2, 0.0)):
        y = fn(qkv)
        outputs.append(y * real)
        grads.append(torch.autograd.grad(y, qkv, grad)[0])
    for y, g in zip(outputs[1:], grads[1:]):
        torch.testing.assert_close(outputs[0], y, rtol=0, atol=1e-12)
        torch.testing.assert_close(grads[0], g, rtol=0, atol=1e-12)


def test_the_variable_length_call_keeps_instances_apart_under_dropout():
    """With dropout on, changing instance B's tokens leaves A's outputs exactly as they were."""
    plan = attention_plan(IDS, bucket=4)
    qkv = torch.randn(2, 16, 24, dtype=torch.float64)
    other = qkv.clone()
    other[0, 5:8] = torch.randn(3, 24, dtype=torch.float64)
    torch.manual_seed(3)
    a = attend_varlen(qkv, plan, 2, 0.5)
    torch.manual_seed(3)
    b = attend_varlen(other, plan, 2, 0.5)
    torch.testing.assert_close(a[0, :5], b[0, :5], rtol=0, atol=0)
    torch.testing.assert_close(a[:, 10:], b[:, 10:], rtol=0, atol=0)
    assert not torch.equal(a[0, 5:8], b[0, 5:8])


def test_an_encoder_layer_compiles_without_graph_breaks():
    """torch.compile traces a layer (training mode, dropout on) as one graph on dense, padded
    and packed loader batches, and the last layer's masked-positions-only form too: the plan's
    indices come from the host, so nothing inside has a data-dependent shape."""
    from model.attention import instance_ids, query_attention_mask

    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB)).train()
    for kind, lengths in BATCHES.items():
        batch = collate([shard_row(n, seed) for seed, n in enumerate(lengths)])
        torch._dynamo.reset()
        x = torch.randn(*batch["input_ids"].shape, 128)
        explained = torch._dynamo.explain(model.bert.layers[0])(x, batch["layout"].plan, None)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), kind
        ids = instance_ids(batch["attention_mask"], batch["sequence_ids"], batch["input_ids"])
        queries = batch["masked_lm_positions"]
        explained = torch._dynamo.explain(model.bert.layers[-1])(
            x, None, query_attention_mask(ids, queries), queries)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), kind
