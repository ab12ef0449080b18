"""The BERT encoder and heads: packing, padding, the masked-only MLM head, losses, sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common import shard_format
from model.attention import (
    attend_instances,
    attention_mask_4d,
    attention_plan,
    instance_ids,
    packed_position_ids,
    split_heads,
)
from model.bert import BertConfig, BertModel, bert_base, bert_large, bert_mini, bert_tiny
from model.cpu_ops import Dropout, attend, dropout, keep_mask, stock_ops
from model.heads import BertForPreTraining, BertForSequenceClassification, masked_mean_loss

VOCAB = 1000


def tiny(**changes) -> BertConfig:
    return bert_tiny(vocab_size=VOCAB, **changes)


def pretraining_model(seed: int = 0, next_sentence: bool = True) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(tiny(), next_sentence=next_sentence).eval()
    with torch.no_grad():  # non-zero biases, so that a mix-up of positions or heads shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def instance(length: int, len_a: int, seed: int) -> dict[str, torch.Tensor]:
    """One unpacked instance: [CLS] A [SEP] B [SEP] token types, random ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (length,), generator=g)
    ids[0], ids[len_a + 1], ids[-1] = 2, 3, 3
    types = torch.zeros(length, dtype=torch.long)
    types[len_a + 2:] = 1
    return {"input_ids": ids, "token_type_ids": types}


def test_parameter_counts_match_the_paper_sizes():
    with torch.device("meta"):  # counts only: no memory, no initialisation time
        sizes = {name: (BertModel(f()).num_parameters(),
                        sum(p.numel() for p in BertForPreTraining(f()).parameters()))
                 for name, f in [("base", bert_base), ("large", bert_large),
                                 ("mini", bert_mini), ("tiny", bert_tiny)]}
    # The same numbers as transformers' BertModel / BertForPreTraining (bert-base-uncased: 110M,
    # bert-large-uncased: 335M encoder); the MLM decoder is tied, so it adds only its bias.
    assert sizes == {
        "base": (109_482_240, 110_106_428),
        "large": (335_141_888, 336_226_108),
        "mini": (11_170_560, 11_267_900),
        "tiny": (4_385_920, 4_433_468),
    }


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="^hidden_size 100 is not a multiple of num_attention_heads 12$"):
        BertConfig(hidden_size=100, num_attention_heads=12)
    with pytest.raises(ValueError, match=r"^hidden_dropout_prob must be in \[0, 1\), got 1.5$"):
        BertConfig(hidden_dropout_prob=1.5)
    with pytest.raises(ValueError, match="^hidden_act 'relu6' not in "):
        BertConfig(hidden_act="relu6")
    assert BertConfig.from_dict({**bert_mini().to_dict(), "model_type": "bert"}) == bert_mini()


def test_packed_position_ids_match_the_shard_format():
    seq = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3], np.uint8)
    expected = shard_format.position_ids(seq)
    assert expected.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 0]
    padded = torch.tensor([seq.tolist() + [-1, -1]])
    assert packed_position_ids(padded)[0, :10].tolist() == expected.tolist()


def test_dense_batches_pass_no_mask_to_sdpa():
    ids = torch.ones(2, 5, dtype=torch.long)
    assert attention_mask_4d(instance_ids(None, None, ids)) is None
    assert attention_mask_4d(instance_ids(torch.ones(2, 5), torch.zeros(2, 5), ids)) is None
    mask = attention_mask_4d(instance_ids(torch.tensor([[1, 1, 0]]), torch.tensor([[0, 1, 0]]),
                                          ids[:1, :3]))
    assert mask[0, 0].tolist() == [[True, False, False], [False, True, False],
                                   [False, False, True]]


def test_padding_does_not_change_real_tokens():
    model = pretraining_model().bert
    short, long = instance(9, 3, seed=1), instance(14, 6, seed=2)
    ids = torch.zeros(2, 14, dtype=torch.long)
    types = torch.zeros(2, 14, dtype=torch.long)
    mask = torch.zeros(2, 14, dtype=torch.long)
    for row, inst in enumerate([short, long]):
        n = len(inst["input_ids"])
        ids[row, :n], types[row, :n], mask[row, :n] = inst["input_ids"], inst["token_type_ids"], 1
    with torch.no_grad():
        batch = model(ids, types, mask)
        alone = model(short["input_ids"][None], short["token_type_ids"][None])
        pooled = model.pool(batch)
    torch.testing.assert_close(batch[0, :9], alone[0])
    torch.testing.assert_close(pooled[0], model.pool(alone)[0])
    assert torch.isfinite(batch).all()  # padding rows attend to padding: no NaN anywhere


def pack(instances: list[dict], length: int) -> dict[str, torch.Tensor]:
    """One packed row of `instances` padded to `length`, as the shard loader collates it."""
    row = {"input_ids": torch.zeros(length, dtype=torch.long),
           "token_type_ids": torch.zeros(length, dtype=torch.long),
           "attention_mask": torch.zeros(length, dtype=torch.long),
           "sequence_ids": torch.full((length,), -1, dtype=torch.long)}
    start = 0
    for k, inst in enumerate(instances):
        n = len(inst["input_ids"])
        row["input_ids"][start:start + n] = inst["input_ids"]
        row["token_type_ids"][start:start + n] = inst["token_type_ids"]
        row["attention_mask"][start:start + n] = 1
        row["sequence_ids"][start:start + n] = k
        start += n
    return row


def test_packed_row_equals_instances_computed_alone():
    model = pretraining_model()
    a, b = instance(11, 4, seed=3), instance(8, 2, seed=4)
    # masked positions: A at 2, 5, 9; B at 1, 6 (row-relative 12, 17 in the packed row)
    masked_a, masked_b = torch.tensor([2, 5, 9]), torch.tensor([1, 6])
    labels_a, labels_b = torch.tensor([17, 42, 99]), torch.tensor([7, 500])
    nsp = torch.tensor([1, 0])

    row = pack([a, b], length=22)
    packed = model(**{k: v[None] for k, v in row.items()},
                   masked_lm_positions=torch.cat([masked_a, masked_b + 11, torch.tensor([0])])[None],
                   masked_lm_ids=torch.cat([labels_a, labels_b, torch.tensor([-100])])[None],
                   next_sentence_label=torch.tensor([[1, 0, -100]]))
    hidden = model.bert(**{k: v[None] for k, v in row.items()})

    unpacked = model(input_ids=torch.stack([a["input_ids"], F.pad(b["input_ids"], (0, 3))]),
                     token_type_ids=torch.stack([a["token_type_ids"],
                                                 F.pad(b["token_type_ids"], (0, 3))]),
                     attention_mask=torch.tensor([[1] * 11, [1] * 8 + [0] * 3]),
                     masked_lm_positions=torch.stack([masked_a, F.pad(masked_b, (0, 1))]),
                     masked_lm_ids=torch.stack([labels_a, F.pad(labels_b, (0, 1), value=-100)]),
                     next_sentence_label=nsp)
    for inst, start in [(a, 0), (b, 11)]:
        n = len(inst["input_ids"])
        alone = model.bert(inst["input_ids"][None], inst["token_type_ids"][None])
        torch.testing.assert_close(hidden[0, start:start + n], alone[0])

    torch.testing.assert_close(packed.mlm_logits[0, :3], unpacked.mlm_logits[0])
    torch.testing.assert_close(packed.mlm_logits[0, 3:5], unpacked.mlm_logits[1, :2])
    torch.testing.assert_close(packed.nsp_logits[0, :2], unpacked.nsp_logits)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(packed, name), getattr(unpacked, name))
    assert (packed.mlm_count.item(), packed.nsp_count.item()) == (5, 2)
    assert (unpacked.mlm_count.item(), unpacked.nsp_count.item()) == (5, 2)

    # gradients too: the packed row trains the model exactly as the two instances do
    grads = []
    for out in (packed, unpacked):
        model.zero_grad()
        out.loss.backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_masked_only_mlm_head_equals_dense_head():
    model = pretraining_model()
    inst = [instance(16, 6, seed=s) for s in (5, 6)]
    ids = torch.stack([i["input_ids"] for i in inst])
    types = torch.stack([i["token_type_ids"] for i in inst])
    positions = torch.tensor([[1, 4, 7, 15], [0, 3, 8, 9]])
    with torch.no_grad():
        dense = model.mlm(model.bert(ids, token_type_ids=types))  # every token: (B, T, V)
        sparse = model(ids, positions, types).mlm_logits  # (B, M, V)
    assert dense.shape == (2, 16, VOCAB) and sparse.shape == (2, 4, VOCAB)
    torch.testing.assert_close(sparse, dense[torch.arange(2)[:, None], positions])


def test_losses_equal_cross_entropy_with_ignored_labels():
    model = pretraining_model()
    ids = torch.stack([instance(12, 4, seed=s)["input_ids"] for s in (7, 8, 9)])
    positions = torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]])
    labels = torch.tensor([[10, 20, 30], [40, 50, -100], [60, -100, -100]])
    nsp = torch.tensor([0, 1, -1])  # -1: an MLM-only instance, no NSP loss
    out = model(ids, positions, masked_lm_ids=labels, next_sentence_label=nsp)
    expected_mlm = F.cross_entropy(out.mlm_logits.flatten(0, 1), labels.flatten(),
                                   ignore_index=-100)
    expected_nsp = F.cross_entropy(out.nsp_logits[:2], nsp[:2])
    torch.testing.assert_close(out.mlm_loss, expected_mlm)
    torch.testing.assert_close(out.nsp_loss, expected_nsp)
    torch.testing.assert_close(out.loss, expected_mlm + expected_nsp)
    assert (out.mlm_count.item(), out.nsp_count.item()) == (6, 2)
    predicted = out.mlm_logits.argmax(-1)
    assert out.mlm_correct.item() == int(((predicted == labels) & (labels >= 0)).sum())

    loss, correct, count = masked_mean_loss(torch.zeros(2, 3), torch.tensor([-100, -1]))
    assert (loss.item(), correct.item(), count.item()) == (0.0, 0, 0)


def test_mlm_only_model_has_no_nsp_head():
    model = pretraining_model(next_sentence=False)
    assert model.nsp is None
    assert not any(n.startswith("nsp") for n, _ in model.named_parameters())
    ids = torch.stack([instance(10, 3, seed=s)["input_ids"] for s in (10, 11)])
    out = model(ids, torch.tensor([[1, 2], [3, 4]]), masked_lm_ids=torch.tensor([[5, 6], [7, 8]]),
                next_sentence_label=torch.tensor([-1, -1]))
    assert out.nsp_logits is None and out.nsp_loss is None
    torch.testing.assert_close(out.loss, out.mlm_loss)


def test_decoder_is_tied_to_the_word_embeddings():
    model = pretraining_model()
    assert model.mlm.decoder.weight is model.bert.embeddings.word.weight
    ids = torch.stack([instance(10, 3, seed=12)["input_ids"]])
    out = model(ids, torch.tensor([[1, 2]]), masked_lm_ids=torch.tensor([[5, 6]]))
    out.loss.backward()
    # the embedding gradient has the decoder's dense part: every vocabulary row gets some
    assert (model.bert.embeddings.word.weight.grad.abs().sum(1) > 0).all()


def test_sequence_classification_losses():
    torch.manual_seed(0)
    ids = torch.stack([instance(10, 3, seed=s)["input_ids"] for s in (13, 14, 15)])
    classifier = BertForSequenceClassification(tiny(), num_labels=3).eval()
    out = classifier(ids, labels=torch.tensor([0, 2, 1]))
    assert out.logits.shape == (3, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([0, 2, 1])))
    regressor = BertForSequenceClassification.from_encoder(classifier.bert, num_labels=1).eval()
    torch.testing.assert_close(regressor.bert(ids), classifier.bert(ids))
    targets = torch.tensor([0.5, 4.0, 2.25])
    out = regressor(ids, labels=targets)
    assert out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits[:, 0], targets))


def test_initialisation_follows_bert():
    torch.manual_seed(0)
    model = BertForPreTraining(bert_mini())
    weights = torch.cat([model.bert.layers[0].intermediate.weight.flatten(),
                         model.bert.embeddings.word.weight.flatten()])
    assert abs(weights.std().item() - 0.0176) < 0.0005  # N(0, 0.02) truncated at 2 std: 0.88 * 0.02
    assert weights.abs().max().item() <= 0.04
    assert (model.bert.layers[0].output_norm.weight == 1).all()
    assert (model.bert.layers[0].output.bias == 0).all() and (model.mlm.bias == 0).all()


def test_output_positions_compute_only_the_wanted_tokens_exactly():
    """The sparse last layer (queries only at the masked and [CLS] positions) changes nothing."""
    model = pretraining_model().bert
    row = pack([instance(9, 3, seed=16), instance(7, 2, seed=17)], length=20)
    batch = {k: torch.stack([v, v.roll(3)]) for k, v in row.items()}  # padding in mid-row too
    wanted = torch.tensor([[0, 4, 9, 12, 15], [3, 5, 12, 13, 18]])
    with torch.no_grad():
        full = model(**batch)
        sparse = model(**batch, output_positions=wanted)
    assert sparse.shape == (2, 5, 128)
    torch.testing.assert_close(sparse, full[torch.arange(2)[:, None], wanted])


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


def test_attention_plan_groups_instances_by_length_bucket():
    ids = torch.tensor([[0, 0, 0, 1, 1, -1, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    plan = attention_plan(ids, bucket=4)
    short, full = plan.groups  # lengths 3 and 2 share the bucket of 4; the full row is alone
    assert short.index.tolist() == [[0, 1, 2], [3, 4, 3]]  # the slot past B's end repeats its start
    assert short.real.tolist() == [[True, True, True], [True, True, False]]
    assert short.key_mask.shape == (2, 1, 1, 3)
    assert full.index.tolist() == [list(range(8, 16))] and full.key_mask is None
    assert plan.token_index.tolist() == [0, 1, 2, 3, 4, *range(8, 16)]
    assert attention_plan(torch.zeros(2, 8, dtype=torch.long)) is None  # dense: no plan
    assert attention_plan(None) is None


def test_attention_per_instance_equals_the_block_diagonal_mask():
    torch.manual_seed(0)
    ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 2],
                        [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
    qkv = torch.randn(2, 16, 3 * 8, dtype=torch.float64)  # A = 2 heads of D = 4
    per_instance = attend_instances(qkv, attention_plan(ids, bucket=4), num_heads=2,
                                    dropout_p=0.0)
    q, k, v = split_heads(qkv, 2)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_4d(ids))
    masked = masked.transpose(1, 2).reshape(2, 16, 8)  # (B, A, T, D) -> (B, T, H)
    real = ids >= 0
    torch.testing.assert_close(per_instance[real], masked[real])
    assert (per_instance[~real] == 0).all()  # padding gets no attention output


def test_dropout_in_training_stays_within_each_instance():
    """With dropout on, changing instance B's tokens leaves A's states exactly as they were."""
    model = pretraining_model().bert.train()
    a, b = instance(11, 4, seed=20), instance(8, 2, seed=21)
    other_b = instance(8, 3, seed=22)
    states = []
    for second, seed in [(b, 0), (other_b, 0), (b, 1)]:
        row = {k: v[None] for k, v in pack([a, second], length=24).items()}
        torch.manual_seed(seed)
        states.append(model(**row)[0, :11])
    assert torch.equal(states[0], states[1])
    assert not torch.allclose(states[0], states[2])  # dropout is really on: another seed differs


def test_padding_inside_a_row_falls_back_to_the_row_mask():
    """An attention mask with a hole (padding inside an instance) cannot be split into runs:
    the model masks whole rows instead, and the real tokens get the states they have without
    the hole (same tokens, same positions)."""
    ids = torch.tensor([[0, 0, 1, 1], [0, 0, -1, 0]])  # row 1: padding inside instance 0
    assert attention_plan(ids) is None
    model = pretraining_model().bert
    one = instance(9, 3, seed=30)
    holed = {k: torch.cat([v[:5], torch.zeros(2, dtype=v.dtype), v[5:]])[None]
             for k, v in one.items()}
    mask = torch.ones(1, 11, dtype=torch.long)
    mask[0, 5:7] = 0
    positions = torch.cat([torch.arange(5), torch.zeros(2, dtype=torch.long),
                           torch.arange(5, 9)])[None]
    with torch.no_grad():
        with_hole = model(**holed, attention_mask=mask, position_ids=positions)
        compact = model(**{k: v[None] for k, v in one.items()})
    torch.testing.assert_close(with_hole[mask.bool()], compact[0])


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


def test_the_loaders_batch_layout_gives_the_forward_it_would_make_itself():
    """collate works out the attention plan on the host (`BatchLayout`); the forward with it
    equals the forward that makes its own, also after the layout's move to a device."""
    from training.loader import collate

    def row(lengths: list[int], seed: int) -> shard_format.Row:
        g = np.random.default_rng(seed)
        n = sum(lengths)
        return shard_format.Row(
            input_ids=g.integers(5, VOCAB, n), segment_ids=np.zeros(n, np.uint8),
            sequence_ids=np.repeat(np.arange(len(lengths)), lengths).astype(np.uint8),
            masked_lm_positions=np.array([1, n - 2]), masked_lm_ids=g.integers(5, VOCAB, 2),
            next_sentence_labels=np.zeros(len(lengths), np.int8))

    model = pretraining_model()
    packed = collate([row([9, 12], seed=1), row([7], seed=2)])
    dense = collate([row([16], seed=3), row([16], seed=4)])
    assert packed["layout"].masked and len(packed["layout"].plan.groups) == 1
    assert not dense["layout"].masked and dense["layout"].plan is None
    for batch in (packed, dense):
        inputs = {k: v for k, v in batch.items() if k != "layout"}
        own = model(**inputs)
        for layout in (batch["layout"], batch["layout"].to("cpu", non_blocking=True)):
            given = model(**inputs, layout=layout)
            assert torch.equal(given.mlm_logits, own.mlm_logits)
            assert torch.equal(given.nsp_logits, own.nsp_logits)
    # The forward does use the layout it is given: the dense one lets the packed rows' instances
    # (and padding) attend to each other.
    inputs = {k: v for k, v in packed.items() if k != "layout"}
    assert not torch.equal(model(**inputs, layout=dense["layout"]).mlm_logits,
                           model(**inputs).mlm_logits)
