"""The training step's GPU readiness, checked on CPU: no host-device syncs in a forward and
backward of loader-made batches in either attention form (the CPU's per-instance plan, the
GPU's whole rows under a mask), the two forms equal, and encoder layers that torch.compile
traces without graph breaks and without passing its recompile limit over a run's shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.attention import (
    BatchLayout,
    attend_instances,
    attention_mask_4d,
    attention_plan,
    split_heads,
)
from model.bert import bert_tiny
from model.compiling import LAYER_RECOMPILE_LIMIT, compile_layers
from model.heads import BertForPreTraining
from tests.model.tiny_models import VOCAB, shard_row
from training.batching import collate
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


def gpu_layout(layout: BatchLayout) -> BatchLayout:
    """What `BatchLayout.to` gives for a GPU: whole rows, masked where the host saw it."""
    moved = layout.to("meta")  # any device but the CPU
    assert moved.plan is None and moved.masked == layout.masked
    assert layout.pin_memory() == moved  # pinned only for a GPU: the plan is not pinned
    return moved


@pytest.mark.parametrize("form", ["plan", "whole rows"])
@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_a_training_step_makes_no_host_device_sync(kind, form):
    """forward + backward in training mode (dropout on) on a loader-made batch: every index
    comes from the host-made plan (`BatchLayout`), or the row mask is made from the ids on the
    device, so on a GPU the step never waits."""
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB)).train()
    batch = collate([shard_row(lengths, seed) for seed, lengths in enumerate(BATCHES[kind])])
    assert (batch["layout"].plan is not None) == (kind != "dense")
    assert batch["layout"].masked == (kind != "dense")
    if form == "whole rows":
        batch["layout"] = gpu_layout(batch["layout"])
    with SyncCounter() as counter:
        out = model(**batch)
        out.loss.backward()
    assert counter.ops == []
    assert all(p.grad is not None for p in model.parameters())


IDS = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 2],
                    [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])


def test_per_instance_attention_equals_the_block_diagonal_mask():
    """`attend_instances` (the CPU's per-bucket calls) against SDPA under the (B, 1, T, T) mask
    (the GPU's one call per layer), fp64: real tokens' outputs and the gradients through them
    agree to rounding."""
    torch.manual_seed(0)
    plan = attention_plan(IDS, bucket=4)
    qkv = torch.randn(2, 16, 3 * 8, dtype=torch.float64, requires_grad=True)  # A = 2, D = 4
    real = (IDS >= 0)[..., None]
    grad = torch.randn(2, 16, 8, dtype=torch.float64) * real

    def masked(qkv):
        q, k, v = split_heads(qkv, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_4d(IDS))
        return y.transpose(1, 2).reshape(2, 16, 8)  # (B, A, T, D) -> (B, T, H)

    outputs, grads = [], []
    for fn in (masked, lambda x: attend_instances(x, plan, 2, 0.0)):
        y = fn(qkv)
        outputs.append(y * real)
        grads.append(torch.autograd.grad(y, qkv, grad)[0])
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_the_gpu_layout_gives_the_plans_hidden_states(kind):
    """A whole model on whole rows under the mask (what a GPU runs) against the per-instance
    plan (what the CPU runs), fp64, eval: the masked positions' states and both losses agree."""
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB)).double().eval()
    batch = collate([shard_row(lengths, seed) for seed, lengths in enumerate(BATCHES[kind])])
    with torch.no_grad():
        planned = model(**batch)
        whole_rows = model(**{**batch, "layout": gpu_layout(batch["layout"])})
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_logits"):
        torch.testing.assert_close(getattr(planned, name), getattr(whole_rows, name),
                                   rtol=0, atol=1e-10)


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


def test_compiled_layers_stay_within_their_recompile_limit_over_a_run():
    """The GPU's whole-row form through compiled layers (fullgraph) over what a pre-training
    run feeds them: phase-1 batches whose T and masked positions vary, a validation pass, then
    phase-2 batches of another micro-batch size and their validation. The variants pass dynamo's default limit of 8
    (with fullgraph the 9th is an error: phase 2 of a GPU run stopped so) and stay within the
    layers' own limit."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB)).train()
    compile_layers(model.bert, backend="aot_eager")
    phases = [(True, [[20], [13], [37]]), (True, [[9, 12], [7], [40, 3, 20]]),
              (False, [[30], [12, 8], [5]]), (True, [[64, 30], [90]]), (True, [[41], [77, 12]]),
              (False, [[50, 40], [33]])]
    try:
        for train, lengths in phases:
            batch = collate([shard_row(n, seed) for seed, n in enumerate(lengths)])
            batch["layout"] = gpu_layout(batch["layout"])
            model.train(train)
            with torch.set_grad_enabled(train):
                out = model(**batch)
            if train:
                out.loss.backward()
        variants = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert 8 < variants <= LAYER_RECOMPILE_LIMIT
