"""ModernBERT on the real tokens of padded and packed rows (`RealTokens`) against whole rows
under a mask, the MLM head on labelled rows only (`sparse_prediction`), and the loss's
cross-entropy against `F.cross_entropy`, bit for bit."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from model import real_tokens
from model.attention import batch_layout, instance_ids
from model.bert import bert_tiny
from model.cpu_ops import stock_ops
from model.heads import BertForPreTraining, _CrossEntropy, masked_mean_loss
from model.modernbert import ModernBertModel, modernbert_tiny

VOCAB = 512


def config(**changes):
    """3 layers (global, local, local), a window of 8 tokens each side: rows of 40 reach past it."""
    return modernbert_tiny(vocab_size=VOCAB, local_attention=16, **changes)


@pytest.fixture(scope="module")
def encoder() -> ModernBertModel:
    torch.manual_seed(0)
    return ModernBertModel(config()).eval()


def padded() -> dict[str, Tensor]:
    """Rows of 40, 29 and 11 real tokens."""
    ids = torch.randint(1, VOCAB, (3, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 29:] = 0
    mask[2, 11:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def packed() -> dict[str, Tensor]:
    """Instances of 30 and 20 tokens in one bucket (the shorter one's slots padded), then 10 of
    padding; a second row of one instance of 60."""
    ids = torch.randint(1, VOCAB, (2, 60), generator=torch.Generator().manual_seed(2))
    sequence_ids = torch.tensor([[0] * 30 + [1] * 20 + [-1] * 10, [0] * 60])
    return {"input_ids": ids, "sequence_ids": sequence_ids}


@pytest.mark.parametrize("chunks", [False, True], ids=["masked", "chunked"])
@pytest.mark.parametrize("batch", [padded, packed])
def test_real_tokens_give_the_whole_rows_states(encoder, batch, chunks, monkeypatch):
    """Every layer's states at the real tokens, and a sparse last layer's queries; local
    layers under an n x n mask, or in chunks (rows past 2 windows here)."""
    if chunks:
        monkeypatch.setattr(real_tokens, "CHUNKED_WINDOWS", 2)
    inputs = batch()
    ids = instance_ids(inputs.get("attention_mask"), inputs.get("sequence_ids"),
                       inputs["input_ids"])
    real = ids >= 0
    tokens = encoder.real_tokens(ids, None, ids.shape, ids.device)
    assert tokens is not None and tokens.token_index.numel() == int(real.sum())
    positions = torch.tensor([[0, 5, 9], [3, 0, 1]] + ([[10, 0, 2]] if len(ids) == 3 else []))
    with torch.no_grad():
        states = encoder(**inputs, output_hidden_states=True)
        sparse = encoder(**inputs, output_positions=positions)
        with stock_ops():  # whole rows under a mask
            assert encoder.real_tokens(ids, None, ids.shape, ids.device) is None
            rows = encoder(**inputs, output_hidden_states=True)
            rows_sparse = encoder(**inputs, output_positions=positions)
    for mine, theirs in zip(states.layers, rows.layers, strict=True):
        torch.testing.assert_close(mine[real], theirs[real])
        assert not mine[~real].any()  # zeros at padding
    torch.testing.assert_close(sparse, rows_sparse)


def test_the_loaders_plan_and_one_made_here_give_the_same_states(encoder):
    inputs = packed()
    layout = batch_layout(instance_ids(None, inputs["sequence_ids"], inputs["input_ids"]))
    with torch.no_grad():
        assert torch.equal(encoder(**inputs, layout=layout), encoder(**inputs))


def test_full_rows_are_one_bucket_and_local_layers_attend_in_chunks(encoder, monkeypatch):
    """Rows of 40 tokens, 5 windows of 8 (chunks past 2 windows here): the local layers' chunks
    give the masked rows' states, and so does a sparse last layer (local) from every token's."""
    monkeypatch.setattr(real_tokens, "CHUNKED_WINDOWS", 2)
    ids = torch.randint(1, VOCAB, (2, 40), generator=torch.Generator().manual_seed(4))
    for given in (None, instance_ids(torch.ones_like(ids), None, ids)):
        tokens = encoder.real_tokens(given, None, ids.shape, ids.device)
        assert tokens.every_token and [b.shape for b in tokens.buckets] == [(2, 40)]
    inputs = encoder.real_inputs(tokens, torch.arange(40).repeat(2), torch.float32)
    assert inputs[False].banded == (True,) and inputs[True].banded == (False,)
    positions = torch.stack([torch.randperm(40)[:30], torch.randperm(40)[:30]])  # (2, 30)
    assert not encoder.layers[-1].is_global  # 30 x 40 products a row, more than 40 x 3 x 8
    assert encoder.layers[-1].queries_by_chunks(inputs[False], 80, positions)
    with torch.no_grad():
        chunked, sparse = encoder(ids), encoder(ids, output_positions=positions)
        with stock_ops():
            rows = encoder(ids)
    torch.testing.assert_close(chunked, rows)
    torch.testing.assert_close(sparse, rows.gather(1, positions[..., None].expand(-1, -1, 128)))


def pretraining_batch() -> dict[str, Tensor]:
    """`padded` with 4, 2 and 1 labelled masked positions (M = 4, 0 = padding)."""
    batch = padded()
    positions = torch.tensor([[1, 7, 20, 39], [3, 28, 0, 0], [5, 0, 0, 0]])
    targets = batch["input_ids"].gather(1, positions)
    targets[1, 2:], targets[2, 1:] = -100, -100
    return {**batch, "masked_lm_positions": positions, "masked_lm_ids": targets}


def test_the_mlm_head_scores_labelled_rows_only_with_the_same_loss_and_gradients():
    torch.manual_seed(0)
    model = BertForPreTraining(config(), next_sentence=False).train()
    batch = pretraining_batch()
    out = model(**batch)
    out.loss.backward()
    sparse_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert out.mlm_rows.tolist() == [0, 1, 2, 3, 4, 5, 8]
    assert out.mlm_logits.shape == (7, VOCAB) and out.mlm_count.item() == 7
    with stock_ops():  # still sparse rows; whole-row attention, as a second path
        dense = model(**{k: v for k, v in batch.items() if k != "masked_lm_ids"})
    assert dense.mlm_rows is None and dense.mlm_logits.shape == (3, 4, VOCAB)
    torch.testing.assert_close(out.mlm_logits, dense.mlm_logits.flatten(0, 1)[out.mlm_rows])
    expected, correct, count = masked_mean_loss(dense.mlm_logits.flatten(0, 1),
                                                batch["masked_lm_ids"].flatten())
    torch.testing.assert_close(out.mlm_loss, expected)
    assert (out.mlm_correct, out.mlm_count) == (correct, count)
    expected.backward()
    for name, grad in sparse_grads.items():
        torch.testing.assert_close(grad, model.get_parameter(name).grad, msg=name)


def test_berts_head_scores_every_masked_position():
    """BERT's `sparse_prediction` is off: its numbers stay what they were."""
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=VOCAB), next_sentence=False)
    out = model(**pretraining_batch())
    assert out.mlm_rows is None and out.mlm_logits.shape == (3, 4, VOCAB)


@pytest.mark.parametrize("shape", [(7, 2), (40, 3000), (5, 30522)])
def test_cross_entropy_is_torchs_bit_for_bit(shape):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(*shape, generator=g) * 3).requires_grad_()
    labels = torch.randint(0, shape[1], shape[:1], generator=g)
    weights = torch.rand(shape[0], generator=g)
    theirs = F.cross_entropy(logits, labels, reduction="none")
    (theirs * weights).sum().backward()
    their_grad, logits.grad = logits.grad, None
    ours = _CrossEntropy.apply(logits, labels)
    (ours * weights).sum().backward()
    assert torch.equal(ours, theirs) and torch.equal(logits.grad, their_grad)


def test_torch_compile_takes_whole_rows_without_a_graph_break():
    """Under torch.compile (aot_eager: no C++ compiler needed) the real-token path, the sparse
    head and the CPU cross-entropy step aside for static shapes; same loss as eager."""
    torch.manual_seed(0)
    model = BertForPreTraining(config(), next_sentence=False).train()
    batch = pretraining_batch()
    layout = batch_layout(instance_ids(batch["attention_mask"], None, batch["input_ids"]))
    eager = model(**batch, layout=layout).loss
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**batch, layout=layout)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")(**batch, layout=layout).loss
    torch.testing.assert_close(compiled, eager)


def test_torch_ships_the_variable_length_kernel_the_gpu_path_calls():
    """The GPU path (not run here) imports it at its first call: it must exist in this torch."""
    from torch.nn.attention.varlen import varlen_attn

    assert callable(varlen_attn)
