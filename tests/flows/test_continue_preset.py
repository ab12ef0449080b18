"""Continued pre-training has a preset: `bert-dag --preset continue` (and
training/configs/continue.yaml for `bert-pretrain`) trains a released checkpoint at 5e-5 with 6%
warmup; a run from `init_from` at a rate made for training from scratch (tiny: 1e-3) logs one
warning when it starts (training/init_from.py)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from common.tokenization import SPECIAL_TOKENS, save_tokenizer_folder
from flows import steps
from flows.config import PRESETS, SAMPLE, resolve
from flows.stages import StageResult
from model.bert import bert_tiny
from model.heads import BertForPreTraining
from model.hf import save_checkpoint
from training import config as cfg
from training import init_from
from training.pretrain import build_parser as pretrain_parser

REPO = Path(__file__).resolve().parents[2]
CONTINUE_PHASES = [("phase1", 9000, 540, 5e-5, 128, 256), ("phase2", 1000, 60, 5e-5, 512, 256)]


def _phases(config: cfg.PretrainConfig) -> list[tuple]:
    return [(p.name, p.steps, p.warmup_steps, p.learning_rate, p.max_seq_length,
             p.global_batch_size) for p in config.phases]


@pytest.fixture
def checkpoint(tmp_path) -> str:
    """A released-BERT stand-in: bert_tiny's shape (2 layers, 128 hidden) over a 31-token
    vocabulary, in our checkpoint format, with its vocab.txt beside it."""
    folder = str(tmp_path / "released")
    letters = [*SPECIAL_TOKENS, *"abcdefghijklmnopqrstuvwxyz"]
    save_tokenizer_folder(letters, folder)
    torch.manual_seed(0)
    save_checkpoint(BertForPreTraining(bert_tiny(vocab_size=len(letters))), folder)
    return folder


def _continue_settings(root: Path, checkpoint: str, **pretrain) -> dict:
    return {"output": str(root), "data": {"wikipedia": "", "books": str(SAMPLE / "books")},
            "finetune": {"data": ""},
            "pretrain": {"model": {"init_from": checkpoint}, **pretrain}}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "training.init_from" and r.levelno == logging.WARNING]


def test_continue_preset_resolves_and_hands_training_its_rates(checkpoint, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="training.init_from"):
        flow = resolve("continue", _continue_settings(tmp_path / "runs", checkpoint))
    assert "continue" in PRESETS and flow.name == "continue"
    assert (flow.pretrain.model.preset, flow.pretrain.model.init_from) == ("", checkpoint)
    assert _phases(flow.pretrain) == CONTINUE_PHASES
    vocab = StageResult("vocab", checkpoint, "v", False, 0.0)
    shards = [StageResult(f"shards{n}", str(tmp_path / f"shards{n}"), "s", False, 0.0)
              for n in (1, 2)]
    run = steps.pretrain_config(flow, vocab, shards, str(tmp_path / "run"))
    assert [p.train_shards for p in run.phases] == [s.path for s in shards]
    shape = init_from.checkpoint_model_config(run, {"vocab_size": 31})
    assert (shape.num_hidden_layers, shape.hidden_size, shape.vocab_size) == (2, 128, 31)
    assert _warnings(caplog) == []
    # a trial run is one more setting: the warmup keeps its 6% share
    trial = resolve("continue", _continue_settings(tmp_path / "runs", checkpoint,
                                                   phase1={"steps": 50}, phase2={"steps": 10}))
    assert _phases(trial.pretrain) == [("phase1", 50, 3, 5e-5, 128, 256),
                                       ("phase2", 10, 1, 5e-5, 512, 256)]


def test_continue_preset_needs_a_checkpoint(tmp_path):
    settings = _continue_settings(tmp_path, "")
    del settings["pretrain"]
    with pytest.raises(ValueError) as error:
        resolve("continue", settings)
    assert str(error.value) == (
        "preset 'continue' needs pretrain.model.init_from, e.g. --set pretrain.model.init_from="
        "/models/bert-base-uncased (a BERT folder: config.json, weights, vocab.txt)")


def test_the_settings_file_for_bert_pretrain_is_the_same_preset(checkpoint):
    config = cfg.resolve("base", str(REPO / "training" / "configs" / "continue.yaml"),
                         [f"model.init_from={checkpoint}"])
    preset = init_from.continue_preset()
    model = cfg.ModelConfig(**{**vars(preset.model), "preset": "", "init_from": checkpoint})
    assert config == cfg.PretrainConfig(**{**vars(preset), "model": model})
    assert init_from.learning_rate_warning(config) is None


def test_tiny_learning_rate_from_a_checkpoint_warns_once_in_one_line(checkpoint, tmp_path,
                                                                    caplog):
    expected = (
        f"model.init_from={checkpoint} with phase1.learning_rate=0.001, phase2.learning_rate=0.001: "
        "above 0.0001, a rate for training from scratch, which moves the checkpoint far from "
        "what it learned; continued pre-training trains at about 5e-05 (bert-dag --preset "
        "continue, bert-pretrain --config training/configs/continue.yaml)")
    with caplog.at_level(logging.WARNING, logger="training.init_from"):
        flow = resolve("tiny", {"output": str(tmp_path / "runs"),
                                "pretrain": {"model": {"init_from": checkpoint}}})
        assert _warnings(caplog) == [expected]
        # training checks each phase at start and again when it builds the phase's model
        for _ in flow.pretrain.phases:
            init_from.checkpoint_model_config(flow.pretrain, {"vocab_size": 31})
    assert _warnings(caplog) == [expected]


def test_bert_pretrain_warns_at_start_for_its_tiny_preset(checkpoint, tmp_path, caplog):
    args = pretrain_parser().parse_args(["--preset", "tiny",
                                         "--set", f"model.init_from={checkpoint}",
                                         "--set", "phase1.learning_rate=2e-4",
                                         "--set", "phase2.learning_rate=1e-4"])
    config = cfg.resolve(args.preset, args.config, args.set)
    with caplog.at_level(logging.WARNING, logger="training.init_from"):
        init_from.checkpoint_model_config(config, {"vocab_size": 31})
    assert _warnings(caplog) == [(
        f"model.init_from={checkpoint} with phase1.learning_rate=0.0002: above 0.0001, a rate for "
        "training from scratch, which moves the checkpoint far from what it learned; continued "
        "pre-training trains at about 5e-05 (bert-dag --preset continue, bert-pretrain --config "
        "training/configs/continue.yaml)")]
