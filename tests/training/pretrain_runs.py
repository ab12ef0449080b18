"""Pre-training configs and run readers shared by the DeepSpeed pre-training tests."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from common import settings
from training import checkpoint, pretrain
from training import config as cfg
from training.config import PhaseConfig

REPO = Path(__file__).resolve().parents[2]


def make_config(shard_data, output: Path, /, shards: str = "uneven", steps: int = 12,
                **changes):
    """A one-phase bert_tiny run on `shard_data[shards]`. `changes`: sections as mappings of
    their settings (`engine={"zero_stage": 2}`, applied as `--set` would), other fields as
    values (`phases=(...)`, `seed=3`)."""
    phase = PhaseConfig(name="phase1", train_shards=str(shard_data[shards]), max_seq_length=128,
                        micro_batch_size=4, global_batch_size=8, steps=steps,
                        warmup_steps=2, learning_rate=2e-3)
    config = cfg.PretrainConfig(
        model=cfg.ModelConfig(preset="bert_tiny", dropout=0.0),
        data=cfg.PretrainDataConfig(vocab_dir=str(shard_data["vocab"]), num_workers=2,
                                    shuffle_buffer=16),
        cadence=cfg.CadenceConfig(log_every=1, eval_every=0, eval_batches=2, checkpoint_every=0,
                                  export_hf=False),
        output_dir=str(output), phases=(phase,), seed=7)
    sections = {k: v for k, v in changes.items() if k in cfg.SECTIONS}
    # the sections first: a phase's settings that need one of them (decay_steps needs
    # optimizer.schedule=wsd) are checked with it, not against the defaults
    config = settings.apply(config, sections)
    return dataclasses.replace(config, **{k: v for k, v in changes.items() if k not in sections})


def train_losses(output: Path) -> list[float]:
    return [r["loss"] for r in pretrain.read_metrics(str(output)) if r["split"] == "train"]


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    ckpt = output / "checkpoints"
    return checkpoint.consolidated_state_dict(str(ckpt), (ckpt / "latest").read_text().strip())


def checkpoint_dirs(output: Path) -> list[str]:
    return sorted(p.name for p in (output / "checkpoints").iterdir() if p.is_dir())


def subprocess_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    return env


def timeless_metrics(output) -> list[dict]:
    """metrics.jsonl without the wall-clock rates, which differ from run to run."""
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "samples_per_s")}
            for r in pretrain.read_metrics(str(output))]


def pretrain_rows(data) -> list:
    from tests.support.shard_fixtures import read_rows
    return read_rows(data["uneven"])
