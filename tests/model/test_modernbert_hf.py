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
from model.heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from model.hf import export_hf_folder, load_checkpoint, load_hf_checkpoint, save_checkpoint
from model.modernbert import ModernBertModel
from model.modernbert_hf import state_from_hf, state_to_hf
from tests.model.test_modernbert import VOCAB, hf_model, padded_batch, tiny


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
