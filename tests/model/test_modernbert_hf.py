"""ModernBERT through model/hf.py: our models on the modern encoder export to folders that
transformers' Auto classes load with equal logits, transformers' own folders load into ours,
and the round trips both ways are exact."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from common.tokenization import load_tokenizer, save_tokenizer_folder
from finetune.checkpoint import load_encoder
from model.bert import bert_tiny
from model.heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from model.hf import (
    export_hf_folder,
    find_starting_point,
    load_checkpoint,
    load_hf_checkpoint,
    save_checkpoint,
)
from model.modernbert import ModernBertModel
from model.modernbert_hf import state_from_hf, state_to_hf
from tests.model.test_modernbert import VOCAB, hf_model, padded_batch, tiny
from training.init_from import load_starting_weights


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory) -> Path:
    """A WordPiece vocabulary of VOCAB tokens: the special tokens, letters, continuations and
    filler words, as `train_vocab` writes a folder (uncased)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters)]
    vocab += [f"w{i}" for i in range(VOCAB - len(vocab))]
    folder = tmp_path_factory.mktemp("vocab")
    save_tokenizer_folder(vocab, str(folder))
    return folder


def randomised(model: nn.Module, seed: int = 0) -> nn.Module:
    """`model` in eval mode with every bias non-zero (fresh ones are 0), so that a head or bias
    mapped to the wrong place shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model.eval()


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def hf_state_of(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


POSITIONS = torch.tensor([[1, 7, 20, 39], [3, 28, 0, 0], [0, 10, 5, 2]])  # (B, M)


# ---------------------------------------------------------------------------------------------
# Masked LM: ours -> transformers -> ours, transformers -> ours -> transformers


@pytest.mark.parametrize("next_sentence", [False, True], ids=["mlm_only", "with_nsp"])
def test_masked_lm_export_loads_in_transformers_with_equal_logits(next_sentence, vocab_dir,
                                                                   tmp_path):
    """The MLM-only model, or one pre-trained on NSP shards too: transformers' ModernBERT has no
    next-sentence head, so its masked LM is what the export holds."""
    torch.manual_seed(1)
    ours = randomised(BertForPreTraining(tiny(), next_sentence=next_sentence))
    export_hf_folder(ours, str(vocab_dir), str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("modernbert",
                                                              ["ModernBertForMaskedLM"])
    hf, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path,
                                                                 output_loading_info=True)
    assert type(hf) is transformers.ModernBertForMaskedLM
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "the quick brown fox"
    ids = tokenizer(text)["input_ids"]
    assert ids == load_tokenizer(str(vocab_dir)).encode(text).ids
    assert ids[0] == 2 and ids[-1] == 3 and 1 not in ids  # [CLS] ... [SEP], nothing unknown
    ids, mask = padded_batch(seed=11)
    with torch.no_grad():
        expected = hf.eval()(ids, attention_mask=mask).logits
        mine = ours(ids, POSITIONS, attention_mask=mask).mlm_logits
    torch.testing.assert_close(mine, expected[torch.arange(3)[:, None], POSITIONS])

    # and back: every weight as it was but the NSP head (not read back: ModernBERT's folders are
    # masked LMs) and the pooler, for which transformers' masked LM has no place either: it
    # comes back as transformers' `head` (the MLM transform), as fine-tuning reads it
    back = load_hf_checkpoint(str(tmp_path)).state_dict()
    state = {k: v for k, v in ours.state_dict().items() if not k.startswith("nsp.")}
    assert len(state) == len(ours.state_dict()) - 2 * next_sentence  # nsp.weight, nsp.bias
    pooler = [k for k in state if k.startswith("bert.pooler.")]
    assert pooler == ["bert.pooler.dense.weight", "bert.pooler.norm.weight"]
    assert same_state({k: v for k, v in back.items() if k not in pooler},
                      {k: v for k, v in state.items() if k not in pooler})
    for key in pooler:
        assert torch.equal(back[key], state[key.replace("bert.pooler.", "mlm.")])


def test_a_transformers_masked_lm_folder_loads_and_round_trips(vocab_dir, tmp_path):
    hf = randomised(hf_model(transformers.ModernBertForMaskedLM, tiny()), seed=2)
    hf.save_pretrained(tmp_path / "theirs")
    ours = load_hf_checkpoint(str(tmp_path / "theirs")).eval()
    assert ours.config == tiny() and ours.nsp is None  # ModernBERT's: the masked LM alone
    ids, mask = padded_batch(seed=12)
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        mine = ours(ids, POSITIONS, attention_mask=mask).mlm_logits
    torch.testing.assert_close(mine, expected[torch.arange(3)[:, None], POSITIONS])

    export_hf_folder(ours, str(vocab_dir), str(tmp_path / "again"))
    assert same_state(hf_state_of(tmp_path / "again"), hf_state_of(tmp_path / "theirs"))
    assert same_state(load_hf_checkpoint(str(tmp_path / "again")).state_dict(),
                      ours.state_dict())


def test_the_export_names_the_vocabularys_own_special_token_ids(tmp_path):
    """A 30,522-token WordPiece vocabulary laid out as BERT's ([PAD] 0, [UNK] 100, [CLS] 101,
    [SEP] 102, [MASK] 103) under a ModernBERT model: config.json's ids are the vocabulary's,
    not ModernBERT's tokenizer's (50281, 50282), and match the exported tokenizer."""
    vocab = [f"[unused{i}]" for i in range(30522)]
    for token, index in (("[PAD]", 0), ("[UNK]", 100), ("[CLS]", 101), ("[SEP]", 102),
                         ("[MASK]", 103), ("the", 1996)):
        vocab[index] = token
    save_tokenizer_folder(vocab, str(tmp_path / "vocab"))
    export_hf_folder(BertForPreTraining(tiny().replace(vocab_size=30522), next_sentence=False),
                     str(tmp_path / "vocab"), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {key: config[key] for key in ("bos_token_id", "cls_token_id", "eos_token_id",
                                         "sep_token_id", "pad_token_id", "mask_token_id")} == {
        "bos_token_id": 101, "cls_token_id": 101, "eos_token_id": 102, "sep_token_id": 102,
        "pad_token_id": 0, "mask_token_id": 103}
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id,
            tokenizer.mask_token_id) == (101, 102, 0, 103)
    assert tokenizer("the")["input_ids"] == [101, 1996, 102]


# ---------------------------------------------------------------------------------------------
# Fine-tuning heads


def classification_logits(model: nn.Module, ids, mask) -> torch.Tensor:
    return model(ids, attention_mask=mask).logits


def span_logits(model: nn.Module, ids, mask) -> torch.Tensor:
    out = model(ids, attention_mask=mask)
    return torch.stack([out.start_logits, out.end_logits], dim=-1)[mask.bool()]  # (N, 2)


def token_logits(model: nn.Module, ids, mask) -> torch.Tensor:
    return model(ids, attention_mask=mask).logits[mask.bool()]  # (N, C)


def choice_logits(model: nn.Module, ids, mask) -> torch.Tensor:
    # three choices of 40 tokens (40, 29 and 11 real) for each of two questions: (2, 3, 40)
    return model(ids.view(2, 3, -1), attention_mask=mask.view(2, 3, -1)).logits


HEADS = {  # ours, transformers' Auto class, its class, the logits both give
    "classification": (lambda c: BertForSequenceClassification(c, num_labels=3),
                       transformers.AutoModelForSequenceClassification,
                       transformers.ModernBertForSequenceClassification, classification_logits),
    "regression": (lambda c: BertForSequenceClassification(c, num_labels=1),
                   transformers.AutoModelForSequenceClassification,
                   transformers.ModernBertForSequenceClassification, classification_logits),
    "token_classification": (lambda c: BertForTokenClassification(c, num_labels=5),
                             transformers.AutoModelForTokenClassification,
                             transformers.ModernBertForTokenClassification, token_logits),
    "question_answering": (BertForQuestionAnswering, transformers.AutoModelForQuestionAnswering,
                           transformers.ModernBertForQuestionAnswering, span_logits),
    "multiple_choice": (BertForMultipleChoice, transformers.AutoModelForMultipleChoice,
                        transformers.ModernBertForMultipleChoice, choice_logits),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_fine_tuning_heads_export_to_transformers_and_back(name, vocab_dir, tmp_path):
    """Ours -> folder -> transformers' Auto class: equal logits (transformers applies `head`,
    our pooler / token states, then dropout, then `classifier`, which is our `qa_outputs` for
    spans); transformers' weights -> ours -> transformers': the same tensors."""
    make, auto, hf_class, logits = HEADS[name]
    torch.manual_seed(3)
    ours = randomised(make(tiny()), seed=4)
    export_hf_folder(ours, str(vocab_dir), str(tmp_path))
    hf, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf) is hf_class
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    ids, mask = (torch.cat(pair) for pair in zip(padded_batch(seed=13), padded_batch(seed=14)))
    with torch.no_grad():
        expected = logits(hf.eval(), ids, mask)
        mine = logits(ours, ids, mask)
    torch.testing.assert_close(mine, expected)

    theirs = randomised(hf_model(hf_class, tiny(), num_labels=hf.config.num_labels), seed=5)
    state, ignored = state_from_hf(theirs.state_dict(), kind=ours.kind)
    assert ignored == []
    fresh = make(tiny())
    fresh.load_state_dict(state, strict=True)
    assert same_state(state_to_hf(fresh.state_dict()), theirs.state_dict())


@pytest.mark.parametrize("name", ["classification", "multiple_choice"])
def test_mean_pooling_exports_with_transformers_logits(name, vocab_dir, tmp_path):
    """`classifier_pooling="mean"`: the prediction head on the mean of each sequence's real
    token states, as transformers' sequence-classification and multiple-choice models; our
    checkpoints keep the setting."""
    make, auto, hf_class, logits = HEADS[name]
    torch.manual_seed(17)
    ours = randomised(make(tiny().replace(classifier_pooling="mean")), seed=18)
    export_hf_folder(ours, str(vocab_dir), str(tmp_path / "hf"))
    hf = auto.from_pretrained(tmp_path / "hf")
    assert type(hf) is hf_class and hf.config.classifier_pooling == "mean"
    on_cls = make(tiny()).eval()
    on_cls.load_state_dict(ours.state_dict())
    ids, mask = (torch.cat(pair) for pair in zip(padded_batch(seed=13), padded_batch(seed=14)))
    with torch.no_grad():
        mine = logits(ours, ids, mask)
        torch.testing.assert_close(mine, logits(hf.eval(), ids, mask))
        assert not torch.allclose(mine, logits(on_cls, ids, mask))
    save_checkpoint(ours, str(tmp_path / "ours"))
    assert load_checkpoint(str(tmp_path / "ours")).config.classifier_pooling == "mean"


@pytest.mark.parametrize("make", [
    lambda c: BertForPreTraining(c),
    lambda c: BertForPreTraining(c, next_sentence=False),
    lambda c: BertForSequenceClassification(c, num_labels=3),
    lambda c: BertForSequenceClassification(c, num_labels=1),
    lambda c: BertForTokenClassification(c, num_labels=5),
    BertForQuestionAnswering,
    BertForMultipleChoice,
    ModernBertModel,
], ids=["pretraining", "mlm_only", "classification", "regression", "token_classification",
        "question_answering", "multiple_choice", "encoder"])
def test_own_checkpoint_round_trip_is_exact_for_every_head(make: Callable, tmp_path):
    torch.manual_seed(6)
    model = randomised(make(tiny().replace(vocab_size=500, vocab_multiple=64, hidden_dropout_prob=0.1)), seed=7)
    save_checkpoint(model, str(tmp_path))
    loaded = load_checkpoint(str(tmp_path))
    assert type(loaded) is type(model) and loaded.config == model.config
    assert same_state(loaded.state_dict(), model.state_dict())
    if isinstance(loaded, BertForPreTraining):  # the tie survives loading
        assert loaded.mlm.decoder.weight is loaded.bert.word_embeddings.weight


# ---------------------------------------------------------------------------------------------
# One prediction head, initialised as transformers does


def test_the_mlm_transform_is_the_pooler_that_fine_tuning_starts_from(vocab_dir, tmp_path):
    """transformers' ModernBERT holds one `head`: the masked LM trains it and the classifiers
    start from it. Ours likewise: an MLM-only model's pooler is its MLM transform, so our
    checkpoint and the Hugging Face export give fine-tuning the same, trained, pooler."""
    torch.manual_seed(8)
    ours = randomised(BertForPreTraining(tiny(), next_sentence=False), seed=9)
    assert ours.mlm.dense is ours.bert.pooler.dense and ours.mlm.norm is ours.bert.pooler.norm
    save_checkpoint(ours, str(tmp_path / "ours"))
    export_hf_folder(ours, str(vocab_dir), str(tmp_path / "hf"))
    from_ours = load_encoder(str(tmp_path / "ours"))
    from_hf = load_encoder(str(tmp_path / "hf"))
    assert same_state(from_ours.state_dict(), ours.bert.state_dict())
    assert same_state(from_hf.state_dict(), ours.bert.state_dict())
    again = BertForPreTraining(tiny(), next_sentence=False)  # continued pre-training: all there
    assert load_starting_weights(again, find_starting_point(str(tmp_path / "ours"))) == []
    assert same_state(again.state_dict(), ours.state_dict())

    classifier = BertForSequenceClassification.from_encoder(from_ours, num_labels=3).eval()
    export_hf_folder(classifier, str(vocab_dir), str(tmp_path / "classifier"))
    hf = transformers.ModernBertForSequenceClassification.from_pretrained(
        tmp_path / "classifier").eval()
    assert torch.equal(hf.head.dense.weight, ours.mlm.dense.weight)
    ids, mask = padded_batch(seed=15)
    with torch.no_grad():
        torch.testing.assert_close(classifier(ids, attention_mask=mask).logits,
                                   hf(ids, attention_mask=mask).logits)


def test_new_head_layers_are_drawn_as_transformers_draws_modernberts():
    """transformers' `_init_weights`: a task model's `classifier` ~ N(0, 1 / sqrt(H)) truncated
    at initializer_cutoff_factor std (here 2), bias 0; the prediction head's dense at
    initializer_range / sqrt(2 L). BERT's heads keep N(0, initializer_range) at 2 std."""
    torch.manual_seed(10)
    bound = 2 * 128 ** -0.5  # H = 128
    for model, layer in ((BertForSequenceClassification(tiny(), num_labels=64), "classifier"),
                         (BertForQuestionAnswering(tiny()), "qa_outputs"),
                         (BertForMultipleChoice(tiny()), "classifier"),
                         (BertForPreTraining(tiny()), "nsp")):
        weight, bias = getattr(model, layer).weight, getattr(model, layer).bias
        assert 2 * 0.02 < weight.abs().max() <= bound, layer  # far past BERT's 0.04
        assert not bias.any()
    pooler = BertForPreTraining(tiny(), next_sentence=False).bert.pooler.dense.weight
    assert 0.02 / 6 ** 0.5 < pooler.abs().max() <= 2 * 0.02 / 6 ** 0.5  # 2 L = 6
    bert = BertForSequenceClassification(bert_tiny(vocab_size=VOCAB), num_labels=64)
    assert bert.classifier.weight.abs().max() <= 2 * 0.02


def test_span_logits_drop_out_as_transformers_does_in_training(tmp_path, vocab_dir):
    """`ModernBertForQuestionAnswering` applies dropout (`drop`) between `head` and
    `classifier`; so does ours, drawing the same masks: train-mode logits are equal under
    one seed (the encoder itself has no dropout). BERT's span head has none, as
    transformers' `BertForQuestionAnswering`."""
    config = tiny().replace(hidden_dropout_prob=0.5)
    torch.manual_seed(11)
    ours = randomised(BertForQuestionAnswering(config), seed=12).train()
    export_hf_folder(ours, str(vocab_dir), str(tmp_path))
    hf = transformers.ModernBertForQuestionAnswering.from_pretrained(tmp_path).train()
    ids, mask = padded_batch(seed=16)
    with torch.no_grad():
        torch.manual_seed(13)
        mine = span_logits(ours, ids, mask)
        torch.manual_seed(13)
        theirs = span_logits(hf, ids, mask)
        ours.eval()
        plain = span_logits(ours, ids, mask)
    torch.testing.assert_close(mine, theirs)
    assert not torch.allclose(mine, plain)
    assert BertForQuestionAnswering(bert_tiny(vocab_size=VOCAB)).dropout is None
