"""The encoder seam (model/encoders.py): a newcomer adds a third encoder in one file
(tests/support/toy_encoder.py) plus one registry line, and every head, our checkpoints, the
training config's presets, parameter counts and FLOPs take it."""
from __future__ import annotations

import pytest
import torch

from model import encoders
from model.encoders import Encoder
from model.heads import HEADS, BertForPreTraining
from model.hf import load_checkpoint, save_checkpoint
from tests.support import toy_encoder
from tests.support.toy_encoder import ToyConfig, ToyModel

# Every head's constructor options beyond the config (model/heads.py HEADS).
OPTIONS = {"pretraining": {}, "next_token": {}, "classification": {"num_labels": 3},
           "token_classification": {"num_labels": 4}, "question_answering": {},
           "multiple_choice": {}}


@pytest.fixture
def toy(monkeypatch) -> ToyConfig:
    """The toy registered as model/encoders.py `ENCODERS` would hold it: one line."""
    monkeypatch.setitem(encoders.ENCODERS, "toy", Encoder(ToyConfig, ToyModel,
                                                          toy_encoder.PRESETS, toy_encoder))
    return encoders.PRESETS["toy_tiny"](vocab_size=50)


def batch() -> dict[str, torch.Tensor]:
    """Two rows of 10 tokens: one padded after 7, one packing instances of 4 and 6 tokens."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask,
            "sequence_ids": torch.tensor([[0] * 7 + [-1] * 3, [0] * 4 + [1] * 6])}


def test_the_registry_line_brings_the_presets_and_the_arch(toy):
    assert toy == ToyConfig(vocab_size=50)
    assert encoders.arch_of_preset("toy_tiny") == "toy"
    assert "toy_tiny" in encoders.PRESETS and "bert_tiny" in encoders.PRESETS
    assert encoders.encoder_of(toy).hf is toy_encoder
    assert encoders.config_from_dict(encoders.config_to_dict(toy)) == toy
    assert encoders.config_to_dict(toy)["arch"] == "toy"


def test_every_head_runs_on_the_toy_and_trains(toy):
    """Each head's forward with labels gives a loss whose gradient reaches the encoder."""
    b = batch()
    ids, mask = b["input_ids"], b["attention_mask"]
    labels = {
        "pretraining": {"masked_lm_positions": torch.tensor([[1, 3], [2, 8]]),
                        "masked_lm_ids": torch.tensor([[7, -100], [9, 11]]),
                        "sequence_ids": b["sequence_ids"],
                        "next_sentence_label": torch.tensor([[0, -100], [1, 0]])},
        "next_token": {"masked_lm_positions": torch.tensor([[1, 3], [2, 8]]),
                       "masked_lm_ids": torch.tensor([[7, -100], [9, 11]]),
                       "sequence_ids": b["sequence_ids"]},
        "classification": {"labels": torch.tensor([0, 2])},
        "token_classification": {"labels": torch.randint(0, 4, (2, 10))},
        "question_answering": {"start_positions": torch.tensor([1, 2]),
                               "end_positions": torch.tensor([3, 4])},
        "multiple_choice": {"labels": torch.tensor([1])},  # the two rows: one question's choices
    }
    assert sorted(labels) == sorted(HEADS)
    outputs = {}
    for kind, head in HEADS.items():
        torch.manual_seed(1)
        model = head(toy, **OPTIONS[kind])
        assert isinstance(model.bert, ToyModel)
        inputs = ({"input_ids": ids[None], "attention_mask": mask[None]}
                  if kind == "multiple_choice" else {"input_ids": ids, "attention_mask": mask})
        outputs[kind] = out = model(**inputs, **labels[kind])
        assert out.loss.isfinite(), kind
        out.loss.backward()
        assert model.bert.embeddings.word.weight.grad.abs().sum() > 0, kind
    masked = outputs["pretraining"]  # MLM and per-instance NSP of the packed row
    assert masked.mlm_logits.shape == (2, 2, 50) and masked.nsp_logits.shape == (2, 2, 2)
    assert masked.mlm_count.item() == 3 and masked.nsp_count.item() == 3
    # every token but each instance's last predicts the next: 6 + 3 + 5
    assert outputs["next_token"].mlm_logits.shape == (2, 9, 50)
    assert outputs["next_token"].mlm_count.item() == 14
    assert outputs["multiple_choice"].logits.shape == (1, 2)
    assert outputs["question_answering"].start_logits.shape == (2, 10)
    assert outputs["token_classification"].logits.shape == (2, 10, 4)


@pytest.mark.parametrize("kind", [*OPTIONS, "encoder"])
def test_our_checkpoints_round_trip_the_toy_exactly(toy, kind, tmp_path):
    torch.manual_seed(2)
    model = ToyModel(toy) if kind == "encoder" else HEADS[kind](toy, **OPTIONS[kind])
    save_checkpoint(model, str(tmp_path))
    loaded = load_checkpoint(str(tmp_path))
    assert type(loaded) is type(model) and loaded.config == toy
    a, b = loaded.state_dict(), model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_parameters_and_flops_are_the_toys_own(toy):
    H, I, L, V = 16, 32, 2, 50
    encoder = V * H + 2 * H + L * (2 * H + H * I + I + I * H + H) + H * H + H
    assert encoders.count_parameters(toy) == encoder == 3_312
    mlm = H * H + H + 2 * H + V  # transform, LayerNorm, bias (the decoder is the embedding)
    assert encoders.count_parameters(toy, BertForPreTraining) == encoder + mlm + 2 * H + 2
    assert encoders.flops_per_token(toy, 10) == 6 * L * (2 * H * I + H * 10) == 14_208


def test_the_training_config_builds_the_toy(toy):
    """`model.preset=toy_tiny` resolves through the registry; memory and FLOPs read the toy."""
    from training import memory
    from training.config import ModelConfig
    from training.forecast import model_flops_per_row
    from training.memory import parameter_count

    config = ModelConfig(preset="toy_tiny", dropout=0.0).build(50)
    assert config == toy
    assert ModelConfig(arch="toy", preset="bert_tiny").preset == "toy_tiny"
    assert parameter_count(config) == encoders.count_parameters(  # the toy's: no NSP head
        config, lambda c: BertForPreTraining(c, next_sentence=False))
    assert memory.estimate(config, 10, 1, precision="fp32").activations_per_sequence == \
        10 * (2 * (2 * 16 + 2 * 32) * 4 + 16 * 4) + 2 * 50 * 8  # the toy's own, 15% masked
    assert model_flops_per_row(config, 10, 2) == 14_208 * 10 + 6 * (16 * 16 + 50 * 16) * 2
