"""Stopping and resuming pre-training: a resumed run equals the uninterrupted one (after a stop, a
kill -9, on another number of ranks), and a resume refuses what changed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.training.pretrain_runs import (
    REPO,
    checkpoint_dirs,
    final_weights,
    make_config,
    subprocess_env,
    timeless_metrics,
    train_losses,
)
from training import checkpoint, pretrain
from training import config as cfg
from training.launch import torchrun_command


def test_stopped_and_resumed_run_equals_the_uninterrupted_run(data, tmp_path):
    """Stop at step 5 of 9 (checkpoint), resume: same losses and weights, loader position kept
    (2 workers, shuffle buffer, dropout on: RNG states restored too)."""
    changes = {"engine": {"zero_stage": 1}, "steps": 9, "model": {"dropout": 0.1},
               "cadence": {"checkpoint_every": 3, "keep_checkpoints": 2}}
    full = tmp_path / "full"
    pretrain.run(make_config(data, full, **changes))
    parts = tmp_path / "parts"
    first = pretrain.run(make_config(data, parts, **changes), stop_after_steps=5)
    assert first == {"last_checkpoint": "00-phase1-step00000005", "export_dir": None,
                     "complete": False}
    assert checkpoint_dirs(parts) == ["00-phase1-step00000003", "00-phase1-step00000005"]
    pretrain.run(make_config(data, parts, **changes))
    assert train_losses(parts) == train_losses(full)  # bit-exact
    w_full, w_parts = final_weights(full), final_weights(parts)
    for key in w_full:
        assert torch.equal(w_parts[key], w_full[key]), key


def test_kill_9_and_resume_equals_the_uninterrupted_run(data, tmp_path):
    """A real `bert-pretrain` process killed with SIGKILL after its step-6 checkpoint, then
    restarted: the finished run equals an uninterrupted one. The killed run probes every 4
    steps and the uninterrupted one never: probes are observers (their exports build a model
    and their steps add checkpoints), so the weights are the same bit for bit."""
    def args(out: Path, probe_every: int) -> list[str]:
        config = make_config(data, out, engine={"zero_stage": 2}, model={"dropout": 0.1},
                             cadence={"checkpoint_every": 3, "probe_every": probe_every},
                             steps=12)
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(cfg.to_dict(config)))
        return [sys.executable, "-m", "training.pretrain", "--config", str(path)]

    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(args(full, 0), cwd=REPO, env=subprocess_env(), check=True,
                   capture_output=True)
    proc = subprocess.Popen(args(killed, 4), cwd=REPO, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 600
    while not (latest.exists() and latest.read_text().strip() >= "00-phase1-step00000006"):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(args(killed, 4), cwd=REPO, env=subprocess_env(), check=True,
                   capture_output=True)
    assert not (full / "probes").exists()
    assert sorted(p.name for p in (killed / "probes").iterdir()) == [
        "step-0000004", "step-0000008", "step-0000012"]
    assert train_losses(killed) == train_losses(full)
    for key, value in final_weights(full).items():
        assert torch.equal(final_weights(killed)[key], value)


def test_resume_on_a_different_number_of_ranks_via_universal_checkpoint(data, tmp_path):
    """2 ranks (ZeRO-2) stop at step 6; 1 rank resumes through ds_to_universal + load_universal
    and ends near the uninterrupted 2-rank run."""
    def write(out: Path) -> Path:
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(cfg.to_dict(
            make_config(data, out, engine={"zero_stage": 2}, data={"num_workers": 1}, steps=12))))
        return path

    full, moved = tmp_path / "full", tmp_path / "moved"
    for out, extra in ((full, []), (moved, ["--stop_after_steps", "6"])):
        subprocess.run(torchrun_command(2, ["--config", str(write(out)), *extra]), cwd=REPO,
                       env=subprocess_env(), check=True, capture_output=True, timeout=900)
    resumed = make_config(data, moved, engine={"zero_stage": 2}, data={"num_workers": 1}, steps=12)
    pretrain.run(resumed)
    assert (moved / "checkpoints" / "00-phase1-step00000006-universal").is_dir()
    a, b = train_losses(full), train_losses(moved)
    assert a[:6] == b[:6] and len(b) == 12
    # The schedule continues where it stopped (a lost scheduler state would restart warmup).
    lrs = [[r["lr"] for r in pretrain.read_metrics(str(out)) if r["split"] == "train"]
           for out in (full, moved)]
    assert lrs[1] == lrs[0]
    # Steps 7-12 see the same epoch share in another row order: close, not equal.
    # Measured: mean loss of steps 7-12 7.64 (1 rank, resumed) vs 7.71 (2 ranks); steps 1-6 8.26.
    assert abs(sum(a[6:]) - sum(b[6:])) / 6 < 0.3
    assert sum(b[6:]) / 6 < sum(b[:6]) / 6 - 0.3  # continued training, not a fresh start


def test_resume_refuses_a_changed_config_or_shard_set(data, tmp_path):
    """Fields that shape the training, and the shard set's content, must match the checkpoint's;
    locations and logging/evaluation/checkpoint cadence may change."""
    out = tmp_path / "run"
    pretrain.run(make_config(data, out, steps=4, data={"num_workers": 0}), stop_after_steps=2)
    saved = (out / "config.json").read_text()
    changed = make_config(data, out, steps=4, data={"num_workers": 0}, engine={"zero_stage": 1},
                          model={"dropout": 0.1})
    changed = dataclasses.replace(changed, phases=(dataclasses.replace(
        changed.phases[0], learning_rate=1e-3, global_batch_size=4),))
    with pytest.raises(ValueError) as error:
        pretrain.run(changed)
    message = str(error.value)
    assert "cannot resume" in message and "00-phase1-step00000002" in message
    assert [line.strip() for line in message.splitlines()[1:5]] == [
        "model.dropout: 0.0 -> 0.1", "engine.zero_stage: 0 -> 1",
        "phases.0.global_batch_size: 8 -> 4",
        "phases.0.learning_rate: 0.002 -> 0.001"]
    assert (out / "config.json").read_text() == saved  # not overwritten by the refused config
    other_shards = make_config(data, out, shards="learn", steps=4, data={"num_workers": 0})
    with pytest.raises(ValueError, match=r"phases\.0\.train_shards: .* lists other shards"):
        pretrain.run(other_shards)

    moved = tmp_path / "moved_shards"  # the same shard set elsewhere: fine
    shutil.copytree(data["uneven"], moved)
    free = make_config(data, out, steps=4, data={"num_workers": 0},
                       cadence={"log_every": 2, "eval_batches": 1, "checkpoint_every": 1,
                                "keep_checkpoints": 5})
    free = dataclasses.replace(free, phases=(dataclasses.replace(
        free.phases[0], train_shards=str(moved), micro_batch_size=2),))
    assert pretrain.run(free)["complete"]
    assert checkpoint_dirs(out)[-2:] == ["00-phase1-step00000003", "00-phase1-step00000004"]


def test_a_resumed_run_redoes_the_evaluation_a_kill_skipped(data, tmp_path):
    """Killed after step 2's checkpoint, before its evaluation was logged: resuming evaluates
    step 2 first, then trains on; the metrics equal the uninterrupted run's."""
    changes = {"steps": 4, "cadence": {"eval_every": 2}, "data": {"num_workers": 0},
               "model": {"dropout": 0.1}}
    full, parts = tmp_path / "full", tmp_path / "parts"
    pretrain.run(make_config(data, full, **changes))
    pretrain.run(make_config(data, parts, **changes), stop_after_steps=2)
    records = pretrain.read_metrics(str(parts))
    assert records[-1]["split"] == "validation" and records[-1]["step"] == 2
    (parts / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))
    pretrain.run(make_config(data, parts, **changes))
    resumed = timeless_metrics(parts)
    assert [(r["split"], r["step"]) for r in resumed] == [
        ("train", 1), ("train", 2), ("validation", 2), ("train", 3), ("train", 4),
        ("validation", 4)]
    assert resumed == timeless_metrics(full)


def test_a_checkpoint_whose_config_is_no_longer_accepted_is_named(tmp_path):
    """Session-2 base runs saved bf16 at ZeRO stage 0, refused since: resuming one names the
    checkpoint's config file instead of failing on a config the user never wrote. Its
    precision and ZeRO stage in the flat layout it was saved in."""
    old = {**cfg.to_dict(cfg.tiny()), "precision": "bf16", "zero_stage": 0}
    old = {k: v for k, v in old.items() if k != "engine"}
    (tmp_path / "step-10").mkdir()
    (tmp_path / "step-10" / "config.json").write_text(json.dumps(old))
    state = checkpoint.CheckpointState("step-10", 0, "phase1", 10, 1, 0, {})
    with pytest.raises(ValueError, match=r"step-10/config\.json: this checkpoint's config is no "
                                         r"longer accepted \(engine\.precision=bf16 cannot"):
        pretrain.check_resume(cfg.tiny(), str(tmp_path), state)


def test_a_resume_in_phase_2_needs_no_longer_phase_1s_shards(data, tmp_path):
    """Phase 1 done and its shards deleted (a common clean-up): the run resumes phase 2."""
    phase1_shards = tmp_path / "phase1_shards"
    shutil.copytree(data["learn"], phase1_shards)
    config = make_config(data, tmp_path / "run", shards="learn", steps=2, data={"num_workers": 0})
    first = dataclasses.replace(config.phases[0], train_shards=str(phase1_shards))
    config = dataclasses.replace(config, phases=(
        first, dataclasses.replace(config.phases[0], name="phase2")))
    assert pretrain.run(config, stop_after_steps=2)["complete"] is False
    shutil.rmtree(phase1_shards)
    result = pretrain.run(config)
    assert result["complete"] and result["last_checkpoint"] == "01-phase2-step00000002"
