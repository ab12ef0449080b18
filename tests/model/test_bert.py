"""The BERT encoder and heads: sizes, validation, padding, the masked-only MLM head, losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.bert import BertConfig, BertModel, bert_base, bert_large, bert_mini, bert_tiny
from model.heads import BertForPreTraining, BertForSequenceClassification, masked_mean_loss
from tests.model.tiny_models import VOCAB, instance, pack, pretraining_model, tiny


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
