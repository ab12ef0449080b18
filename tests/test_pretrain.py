"""DeepSpeed pre-training for real (deepspeed.initialize, engine.backward/step, checkpoints) on
shards of the books corpus: learning, ZeRO-stage parity, 2 ranks vs 1, resume, export.

Shards: tests/shard_fixtures.py (a small WordPiece vocabulary trained on the books, then the
real Beam job pipelines.make_shards for both phases; uneven shards re-sharded from its rows).
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.shard_fixtures import book_shards, write_shards
from training import config as cfg
from training import pretrain
from training.config import PhaseConfig
from training.ds_config import build_ds_config
from training.launch import deepspeed_command, torchrun_command
from training.loader import LoaderConfig
from training.optim import LinearWarmupDecay, param_groups

REPO = Path(__file__).resolve().parents[1]
UNEVEN = [20, 12, 28, 15, 9]  # 2 slots: 28+12 | 20+15+9 -> 40 rows each = 10 batches of 4


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    """Shards made by pipelines.make_shards from the books: `learn` (128 tokens, 4 shards),
    `long` (512 tokens, packed), `uneven` (its rows re-sharded into 5 uneven tiny shards)."""
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    vocab_size = len((made.vocab_dir / "vocab.txt").read_text().split())
    uneven = tmp_path_factory.getbasetemp() / "uneven_shards"
    if not (uneven / "manifest.json").exists():
        write_shards(list(made.rows_128), uneven, {"train": UNEVEN, "validation": [16]},
                     vocab_size, 128, rows_per_block=16)
    return {"vocab": made.vocab_dir, "learn": made.shards_128, "long": made.shards_512,
            "uneven": uneven}


def make_config(data, output: Path, shards: str = "uneven", steps: int = 12, **changes):
    phase = PhaseConfig(name="phase1", train_shards=str(data[shards]), max_seq_length=128,
                        micro_batch_size=4, global_batch_size=8, steps=steps,
                        warmup_steps=2, learning_rate=2e-3)
    config = cfg.PretrainConfig(
        model="bert_tiny", vocab_dir=str(data["vocab"]), output_dir=str(output), phases=(phase,),
        dropout=0.0, num_workers=2, shuffle_buffer=16, log_every=1, eval_every=0, eval_batches=2,
        checkpoint_every=0, export_hf=False, seed=7)
    return dataclasses.replace(config, **changes)


def train_losses(output: Path) -> list[float]:
    return [r["loss"] for r in pretrain.read_metrics(str(output)) if r["split"] == "train"]


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    ckpt = output / "checkpoints"
    return pretrain.consolidated_state_dict(str(ckpt), (ckpt / "latest").read_text().strip())


def checkpoint_dirs(output: Path) -> list[str]:
    return sorted(p.name for p in (output / "checkpoints").iterdir() if p.is_dir())


def subprocess_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    return env


def test_tiny_bert_learns_two_phases_and_exports(data, tmp_path):
    """Phase 1 (128) then phase 2 (512) from phase 1's weights; loss falls, MLM accuracy rises;
    the exported folder loads in transformers with our logits."""
    phases = (
        PhaseConfig(name="phase1", train_shards=str(data["learn"]), max_seq_length=128,
                    micro_batch_size=16, global_batch_size=16, steps=60, warmup_steps=6,
                    learning_rate=2e-3),
        PhaseConfig(name="phase2", train_shards=str(data["long"]), max_seq_length=512,
                    micro_batch_size=4, global_batch_size=8, steps=3, warmup_steps=1,
                    learning_rate=1e-3),
    )
    config = make_config(data, tmp_path, phases=phases, dropout=0.1, num_workers=1,
                         shuffle_buffer=500, log_every=10, eval_every=30, eval_batches=4,
                         checkpoint_every=30, keep_checkpoints=2, export_hf=True)
    result = pretrain.run(config)
    records = pretrain.read_metrics(str(tmp_path))
    train = [r for r in records if r["split"] == "train" and r["phase"] == "phase1"]
    first, last = train[0], train[-1]
    print("phase1 train", [(r["step"], round(r["loss"], 3), round(r["mlm_accuracy"], 4))
                           for r in train])
    # Measured (steps 1-10 -> 51-60): loss 8.13 -> 6.97, MLM accuracy 0.027 -> 0.054.
    assert first["loss"] - last["loss"] > 0.9
    assert last["mlm_accuracy"] - first["mlm_accuracy"] > 0.015
    valid = [r for r in records if r["split"] == "validation" and r["phase"] == "phase1"]
    assert [r["step"] for r in valid] == [30, 60]
    assert valid[1]["loss"] < valid[0]["loss"]
    for key in ("tokens_per_s", "samples_per_s", "nsp_loss", "nsp_accuracy"):
        assert key in last
    # The learning rate logged after step s is the next step's: linear decay from 2e-3 over
    # the 54 steps after warmup (LinearWarmupDecay.lr_at(s)), exactly.
    assert [(r["step"], r["lr"]) for r in train] == [(s, 2e-3 * (60 - s) / 54)
                                                      for s in range(10, 61, 10)]
    # Phase 2 continues from phase 1: its first loss is near phase 1's last, far below the start.
    phase2 = [r for r in records if r["split"] == "train" and r["phase"] == "phase2"]
    assert phase2[-1]["global_step"] == 63
    assert phase2[0]["loss"] < first["loss"] - 1.0
    assert checkpoint_dirs(tmp_path) == ["00-phase1-step00000060", "01-phase2-step00000003"]
    assert json.loads((tmp_path / "checkpoints" / "01-phase2-step00000003" / "config.json")
                      .read_text())["phases"][1]["max_seq_length"] == 512
    assert (tmp_path / "loss_curve.png").stat().st_size > 10_000
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert result == {"last_checkpoint": "01-phase2-step00000003",
                      "export_dir": str(tmp_path / "hf"), "complete": True}
    _check_export(data, tmp_path)


def _check_export(data, output: Path):
    import transformers

    from model.heads import BertForPreTraining
    ours = pretrain.build_model(make_config(data, output, shards="long"),
                                {"nsp": True}, final_weights(output)).eval()
    assert isinstance(ours, BertForPreTraining)
    hf = transformers.BertForPreTraining.from_pretrained(str(output / "hf")).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(output / "hf"))
    enc = tokenizer(["It is a truth universally acknowledged.", "Call me Ishmael."],
                    ["Some years ago.", "Never mind how long."], return_tensors="pt", padding=True)
    positions = torch.arange(enc["input_ids"].shape[1]).expand(2, -1)
    with torch.no_grad():
        theirs = hf(**enc)
        mine = ours(enc["input_ids"], positions, token_type_ids=enc["token_type_ids"],
                    attention_mask=enc["attention_mask"])
    mask = enc["attention_mask"].bool()
    torch.testing.assert_close(mine.mlm_logits[mask], theirs.prediction_logits[mask])
    torch.testing.assert_close(mine.nsp_logits, theirs.seq_relationship_logits)


def test_zero_stages_give_the_same_losses(data, tmp_path):
    """ZeRO 0, 1, 2, 3 (fp32, one process): per-step losses and final weights agree."""
    losses, weights = {}, {}
    for stage in (0, 1, 2, 3):
        out = tmp_path / f"zero{stage}"
        pretrain.run(make_config(data, out, zero_stage=stage, steps=6, num_workers=0))
        losses[stage], weights[stage] = train_losses(out), final_weights(out)
    print("ZeRO losses", json.dumps(losses))
    assert len(losses[0]) == 6 and losses[0][-1] < losses[0][0]
    for stage in (1, 2, 3):
        torch.testing.assert_close(torch.tensor(losses[stage]), torch.tensor(losses[0]),
                                   rtol=0, atol=1e-5)
        for key, value in weights[0].items():
            torch.testing.assert_close(weights[stage][key], value, rtol=0, atol=1e-5)


def test_bf16_zero2_dynamic_masking_trains_and_exports(data, tmp_path):
    """bf16 (ZeRO-2's partitioned fp32 master weights) on CPU, re-masking
    every row each epoch (8 steps of 8 rows cross the 40-row epochs of the uneven shards)."""
    pretrain.run(make_config(data, tmp_path, zero_stage=2, precision="bf16", steps=8,
                             num_workers=0, export_hf=True, dynamic_masking=True))
    losses = train_losses(tmp_path)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.2  # measured 8.33 -> 7.83
    weights = final_weights(tmp_path)
    assert all(v.dtype == torch.float32 for v in weights.values())
    assert (tmp_path / "hf" / "model.safetensors").exists()


def test_two_ranks_match_one_rank_on_uneven_shards(data, tmp_path):
    """torchrun, 2 gloo ranks x 1 worker, ZeRO-2, vs 1 rank x 2 workers with 2 accumulation
    steps: the same global batches, so the same losses; 12 steps cross the epoch boundary of
    the uneven shards (10 steps) without a hang."""
    one = tmp_path / "one"
    pretrain.run(make_config(data, one, zero_stage=2, num_workers=2))
    two = tmp_path / "two"
    config_file = tmp_path / "two.yaml"
    two_config = make_config(data, two, zero_stage=2, num_workers=1)
    config_file.write_text(yaml.safe_dump(cfg.to_dict(two_config)))
    cmd = torchrun_command(2, ["--config", str(config_file)], python=sys.executable)
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((two / "checkpoints" / "00-phase1-step00000012" / "training_state.json")
                      .read_text())["loader"]["epoch"] == 1
    print("1 rank", train_losses(one), "\n2 ranks", train_losses(two))
    torch.testing.assert_close(torch.tensor(train_losses(two)), torch.tensor(train_losses(one)),
                               rtol=0, atol=1e-5)
    w1, w2 = final_weights(one), final_weights(two)
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-5)
    # 84 rows in 2 slots of 28+12 | 20+15+9: 40 rows each, so 4 rows cut per epoch, counted.
    for out in (one, two):
        train = [r for r in pretrain.read_metrics(str(out)) if r["split"] == "train"]
        assert [(r["data_epoch"], r["rows_cut"]) for r in train] == [(0, 4)] * 10 + [(1, 8)] * 2


def test_stopped_and_resumed_run_equals_the_uninterrupted_run(data, tmp_path):
    """Stop at step 5 of 9 (checkpoint), resume: same losses and weights, loader position kept
    (2 workers, shuffle buffer, dropout on: RNG states restored too)."""
    changes = {"zero_stage": 1, "steps": 9, "dropout": 0.1, "checkpoint_every": 3,
               "keep_checkpoints": 2}
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


def test_lamb_with_zero_is_refused_with_a_clear_message(data, tmp_path):
    with pytest.raises(ValueError, match="optimizer=lamb cannot be combined with zero_stage=2: "
                                         "ZeRO partitions parameters"):
        make_config(data, tmp_path, optimizer="lamb", zero_stage=2)
    with pytest.raises(ValueError, match="lamb cannot be combined with zero_stage=1"):
        cfg.resolve("tiny", None, ["zero_stage=1", "optimizer=lamb"])
    lamb = make_config(data, tmp_path, optimizer="lamb", zero_stage=0)
    ds = build_ds_config(lamb, lamb.phases[0], world_size=2, on_gpu=True)
    assert ds["optimizer"]["type"] == "Lamb" and ds["zero_optimization"] == {"stage": 0}
    with pytest.raises(ValueError, match="FusedLamb, a CUDA op"):
        build_ds_config(lamb, lamb.phases[0], world_size=1, on_gpu=False)


def test_deepspeed_config_and_param_groups(data, tmp_path):
    config = make_config(data, tmp_path, zero_stage=2, precision="bf16")
    phase = dataclasses.replace(config.phases[0], global_batch_size=256, micro_batch_size=16,
                                steps=1000, warmup_steps=100, learning_rate=1e-4)
    ds = build_ds_config(config, phase, world_size=4, on_gpu=False)
    assert ds["gradient_accumulation_steps"] == 4 and ds["train_batch_size"] == 256
    assert ds["optimizer"] == {"type": "AdamW", "params": {
        "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
        "torch_adam": True, "adam_w_mode": True}}
    assert "scheduler" not in ds  # ours, LinearWarmupDecay, is passed to deepspeed.initialize
    schedule = LinearWarmupDecay(torch.optim.SGD([torch.zeros(1)], lr=1.0), phase.learning_rate,
                                 phase.warmup_steps, phase.steps)
    assert [schedule.lr_at(s) for s in (0, 50, 100, 550, 1000)] == \
        pytest.approx([0.0, 5e-5, 1e-4, 5e-5, 0.0], rel=1e-12, abs=0)
    schedule.load_state_dict({"last_batch_iteration": 549})  # DeepSpeed WarmupDecayLR's state
    assert schedule.state_dict() == {"steps_taken": 550}
    assert schedule.get_lr() == pytest.approx([5e-5], rel=1e-12, abs=0)
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 2
    with pytest.raises(ValueError, match="precision=fp16 needs a GPU"):
        build_ds_config(dataclasses.replace(config, precision="fp16"), phase, 1, on_gpu=False)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size x ranks = 48"):
        build_ds_config(config, phase, world_size=3, on_gpu=False)
    model = pretrain.build_model(config, {"nsp": True})
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == {
        n for n, _ in model.named_parameters() if n.endswith(("bias", "norm.weight"))}
    assert "bert.embeddings.word.weight" in {names[id(p)] for p in decay["params"]}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == \
        sum(p.numel() for p in model.parameters())


def test_config_overrides_file_and_validation(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("zero_stage: 1\nphases:\n  - {name: phase1, steps: 20, warmup_steps: 2, learning_rate: 3e-4}\n")
    config = cfg.resolve("base", str(path), ["phase1.micro_batch_size=8", "precision=fp32"])
    assert (config.zero_stage, config.precision, len(config.phases)) == (1, "fp32", 1)
    p = config.phases[0]
    assert (p.steps, p.learning_rate, p.micro_batch_size, p.max_seq_length) == (20, 3e-4, 8, 128)
    base = cfg.base()
    assert [(q.max_seq_length, q.steps, q.global_batch_size) for q in base.phases] == \
        [(128, 900_000, 256), (512, 100_000, 256)]
    assert cfg.from_dict(cfg.to_dict(base)) == base
    with pytest.raises(ValueError, match="--set phases.0.warmup_steps: must be in"):
        cfg.apply_overrides(config, ["phase1.warmup_steps=50"])
    with pytest.raises(ValueError, match="--set zero_stage: must be 0, 1, 2 or 3"):
        cfg.apply_overrides(config, ["zero_stage=4"])
    with pytest.raises(ValueError, match="unknown field"):
        cfg.apply_overrides(config, ["learning_rate=1"])
    with pytest.raises(ValueError, match=r"--set model: must be one of \['bert_base', "):
        cfg.apply_overrides(config, ["model=bert_huge"])  # at once, not when the model is built
    # Validated after all overrides: a shorter phase and its warmup in either order.
    short = cfg.apply_overrides(cfg.tiny(), ["phase1.steps=3", "phase1.warmup_steps=1"])
    assert (short.phases[0].steps, short.phases[0].warmup_steps) == (3, 1)


def test_auto_precision_is_bf16_only_where_fast_and_allowed():
    auto = cfg.PretrainConfig(precision="auto", zero_stage=1)
    assert (auto.concrete_precision(True), auto.concrete_precision(False)) == ("bf16", "fp32")
    # bf16 needs ZeRO >= 1 and AdamW (LOW_PRECISION_ZERO0_MESSAGE, LAMB_LOW_PRECISION_MESSAGE)
    for stage0_or_lamb in (dataclasses.replace(auto, zero_stage=0),
                           dataclasses.replace(auto, zero_stage=0, optimizer="lamb")):
        assert stage0_or_lamb.concrete_precision(True) == "fp32"
    assert cfg.PretrainConfig(precision="bf16", zero_stage=1).concrete_precision(False) == "bf16"


def test_gpu_example_config_bert_large_on_8_gpus():
    config = cfg.resolve("large", str(REPO / "training" / "configs" / "bert_large_8gpu.yaml"))
    assert (config.model, config.precision, config.zero_stage) == ("bert_large", "bf16", 2)
    ds = [build_ds_config(config, phase, world_size=8, on_gpu=True) for phase in config.phases]
    assert [(d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"],
             d["train_batch_size"]) for d in ds] == [(32, 1, 256), (32, 1, 256)]
    assert ds[0]["optimizer"]["params"]["torch_adam"] is False  # FusedAdam on GPUs
    assert ds[0]["bf16"] == {"enabled": True}
    assert [p.steps for p in config.phases] == [900_000, 100_000]


def test_kill_9_and_resume_equals_the_uninterrupted_run(data, tmp_path):
    """A real `bert-pretrain` process killed with SIGKILL after its step-6 checkpoint, then
    restarted: the finished run equals an uninterrupted one."""
    def args(out: Path) -> list[str]:
        config = make_config(data, out, zero_stage=2, steps=12, dropout=0.1, checkpoint_every=3)
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(cfg.to_dict(config)))
        return [sys.executable, "-m", "training.pretrain", "--config", str(path)]

    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(args(full), cwd=REPO, env=subprocess_env(), check=True, capture_output=True)
    proc = subprocess.Popen(args(killed), cwd=REPO, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 600
    while not (latest.exists() and latest.read_text().strip() >= "00-phase1-step00000006"):
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    subprocess.run(args(killed), cwd=REPO, env=subprocess_env(), check=True, capture_output=True)
    assert train_losses(killed) == train_losses(full)
    for key, value in final_weights(full).items():
        assert torch.equal(final_weights(killed)[key], value)


def test_resume_on_a_different_number_of_ranks_via_universal_checkpoint(data, tmp_path):
    """2 ranks (ZeRO-2) stop at step 6; 1 rank resumes through ds_to_universal + load_universal
    and ends near the uninterrupted 2-rank run."""
    def write(out: Path) -> Path:
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(cfg.to_dict(
            make_config(data, out, zero_stage=2, num_workers=1, steps=12))))
        return path

    full, moved = tmp_path / "full", tmp_path / "moved"
    for out, extra in ((full, []), (moved, ["--stop_after_steps", "6"])):
        subprocess.run(torchrun_command(2, ["--config", str(write(out)), *extra]), cwd=REPO,
                       env=subprocess_env(), check=True, capture_output=True, timeout=900)
    resumed = make_config(data, moved, zero_stage=2, num_workers=1, steps=12)
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


def test_tiny_bert_learns_beyond_the_unigram_plateau(data, tmp_path):
    """800 steps of batch 16: MLM accuracy triples, past the unigram plateau (~0.055). Measured
    in windows of 50 steps: loss 7.98 -> 6.57, MLM accuracy 0.035 -> 0.110; validation MLM
    accuracy 0.114. (NSP stays near its majority-class rate here: 59% of the pipeline's B
    segments are random.)"""
    phase = PhaseConfig(name="phase1", train_shards=str(data["learn"]), max_seq_length=128,
                        micro_batch_size=16, global_batch_size=16, steps=800, warmup_steps=80,
                        learning_rate=1e-3)
    pretrain.run(make_config(data, tmp_path, phases=(phase,), dropout=0.1, num_workers=0,
                             shuffle_buffer=1000, log_every=50, eval_every=0, eval_batches=8))
    train = [r for r in pretrain.read_metrics(str(tmp_path)) if r["split"] == "train"]
    first, last = train[0], train[-1]
    assert first["loss"] - last["loss"] > 1.0
    assert first["mlm_accuracy"] < 0.055 and last["mlm_accuracy"] > 0.09
    valid = [r for r in pretrain.read_metrics(str(tmp_path)) if r["split"] == "validation"]
    assert valid[-1]["step"] == 800 and valid[-1]["mlm_accuracy"] > 0.09



def test_deepspeed_launcher_with_a_hostfile_matches_one_rank(data, tmp_path):
    """`deepspeed --hostfile H --no_ssh --node_rank 0` (node 0 of a one-host hostfile with 2
    slots, as each node of a Slurm/Kubernetes job runs it) starts 2 gloo ranks of
    `-m training.pretrain`; the same global batches as 1 rank x 2 workers."""
    one, two = tmp_path / "one", tmp_path / "two"
    pretrain.run(make_config(data, one, zero_stage=1, steps=6, num_workers=2))
    config_file = tmp_path / "two.yaml"
    config_file.write_text(yaml.safe_dump(cfg.to_dict(
        make_config(data, two, zero_stage=1, steps=6, num_workers=1))))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    cmd = deepspeed_command(["--config", str(config_file)], hostfile=str(hostfile), node_rank=0,
                            master_addr="127.0.0.1")
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.testing.assert_close(torch.tensor(train_losses(two)), torch.tensor(train_losses(one)),
                               rtol=0, atol=1e-5)


# ---------------------------------------------------------------- review fixes

def _engine(config):
    """A real DeepSpeed engine and loader for the config's first phase, as run_phase builds them."""
    dist = pretrain.init_distributed()
    phase = config.phases[0]
    torch.manual_seed(config.seed)
    model = pretrain.build_model(config, pretrain.shard_manifest(phase))
    engine = pretrain.build_engine(config, phase, model, dist)
    return engine, pretrain.ShardLoader(pretrain.build_loader(config, phase, dist)), dist


def _lrs_of_steps(engine, loader, count: int) -> list[float]:
    """The learning rate each of the next `count` optimizer steps runs at."""
    batches, lrs = iter(loader), []
    for _ in range(count):
        lrs.append(engine.optimizer.param_groups[0]["lr"])
        pretrain.train_step(engine, batches)
    return lrs


def test_warmup_of_0_and_1_steps_is_what_the_config_says(data, tmp_path):
    """DeepSpeed's WarmupDecayLR turned warmup 1 into 2 (and started a step late); ours runs
    step s at lr * s / warmup, then decays linearly to 0 at `steps` (here 4, peak 1e-3)."""
    expected = {0: [1e-3, 7.5e-4, 5e-4, 2.5e-4], 1: [0.0, 1e-3, 2e-3 / 3, 1e-3 / 3],
                2: [0.0, 5e-4, 1e-3, 5e-4]}
    for warmup, lrs in expected.items():
        config = make_config(data, tmp_path / f"w{warmup}", steps=4, num_workers=0)
        config = dataclasses.replace(config, phases=(dataclasses.replace(
            config.phases[0], warmup_steps=warmup, learning_rate=1e-3),))
        engine, loader, _ = _engine(config)
        assert _lrs_of_steps(engine, loader, 4) == pytest.approx(lrs, rel=1e-12, abs=0), warmup
        engine.destroy()


def test_bf16_needs_zero_1_and_exports_the_fp32_masters_with_a_cased_vocab(data, tmp_path):
    """bf16 at ZeRO stage 0 is refused (its fp32 masters would not reach the export); at stage 1
    the exported weights are the optimizer's fp32 master weights, not their bf16 rounding, and a
    cased vocabulary exports a tokenizer that keeps case."""
    from deepspeed.utils import safe_get_full_fp32_param
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from model.hf import ours_to_hf
    from pipelines.tokenization import read_vocab, save_tokenizer_folder

    with pytest.raises(ValueError, match="precision=bf16 cannot be combined with zero_stage=0"):
        make_config(data, tmp_path, precision="bf16", zero_stage=0)
    with pytest.raises(ValueError, match="precision=bf16 cannot be combined with zero_stage=0"):
        cfg.resolve("base", None, ["zero_stage=0"])
    assert (cfg.base().precision, cfg.base().zero_stage) == ("bf16", 2)

    cased = tmp_path / "cased_vocab"  # the same tokens, as train_vocab --cased writes them
    save_tokenizer_folder(read_vocab(str(data["vocab"])), str(cased), do_lower_case=False)
    config = make_config(data, tmp_path / "run", precision="bf16", zero_stage=1, steps=3,
                         num_workers=0, vocab_dir=str(cased), export_hf=True)
    engine, loader, dist = _engine(config)
    batches = iter(loader)
    for _ in range(3):
        pretrain.train_step(engine, batches)
    tag = pretrain.save_checkpoint(engine, config, 0, config.phases[0], 3, loader, dist)
    masters = {name: safe_get_full_fp32_param(p).detach().clone()
               for name, p in engine.module.named_parameters()}
    engine.destroy()
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())
    out = pretrain.export(config, str(tmp_path / "run" / "checkpoints"), tag)
    exported = load_file(str(Path(out) / "model.safetensors"))
    expected = ours_to_hf(masters)
    word = "bert.embeddings.word_embeddings.weight"  # trained with rows padded to a multiple
    expected[word] = expected[word][:len(read_vocab(str(cased)))]  # of 64; exported: the vocab's
    assert exported.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(exported[key], value), key

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.tokenize("Emma Woodhouse, handsome") == \
        ["[UNK]", "[UNK]", ",", "hands", "##ome"]  # the vocabulary has no capitals
    assert tokenizer.tokenize("emma woodhouse, handsome") == \
        ["emma", "woodhouse", ",", "hands", "##ome"]


def test_resume_refuses_a_changed_config_or_shard_set(data, tmp_path):
    """Fields that shape the training, and the shard set's content, must match the checkpoint's;
    locations and logging/evaluation/checkpoint cadence may change."""
    out = tmp_path / "run"
    pretrain.run(make_config(data, out, steps=4, num_workers=0), stop_after_steps=2)
    saved = (out / "config.json").read_text()
    changed = make_config(data, out, steps=4, num_workers=0, zero_stage=1, dropout=0.1)
    changed = dataclasses.replace(changed, phases=(dataclasses.replace(
        changed.phases[0], learning_rate=1e-3, global_batch_size=4),))
    with pytest.raises(ValueError) as error:
        pretrain.run(changed)
    message = str(error.value)
    assert "cannot resume" in message and "00-phase1-step00000002" in message
    assert [line.strip() for line in message.splitlines()[1:5]] == [
        "dropout: 0.0 -> 0.1", "zero_stage: 0 -> 1", "phases.0.global_batch_size: 8 -> 4",
        "phases.0.learning_rate: 0.002 -> 0.001"]
    assert (out / "config.json").read_text() == saved  # not overwritten by the refused config
    other_shards = make_config(data, out, shards="learn", steps=4, num_workers=0)
    with pytest.raises(ValueError, match=r"phases\.0\.train_shards: .* lists other shards"):
        pretrain.run(other_shards)

    moved = tmp_path / "moved_shards"  # the same shard set elsewhere: fine
    shutil.copytree(data["uneven"], moved)
    free = make_config(data, out, steps=4, num_workers=0, log_every=2, eval_batches=1,
                       checkpoint_every=1, keep_checkpoints=5)
    free = dataclasses.replace(free, phases=(dataclasses.replace(
        free.phases[0], train_shards=str(moved), micro_batch_size=2),))
    assert pretrain.run(free)["complete"]
    assert checkpoint_dirs(out)[-2:] == ["00-phase1-step00000003", "00-phase1-step00000004"]


def test_validation_is_checked_at_phase_start_and_never_costs_the_checkpoint(data, tmp_path):
    """Too few validation rows for one micro-batch per rank fail before the first step; an
    evaluation that fails (a corrupt validation shard) comes after the step's checkpoint."""
    rows = list(pretrain_rows(data))
    vocab_size = len((data["vocab"] / "vocab.txt").read_text().split())
    small = tmp_path / "small"
    write_shards(rows, small, {"train": [20, 20], "validation": [3]}, vocab_size, 128, 16)
    config = make_config(data, tmp_path / "run_small", steps=2, num_workers=0)
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(small)),))
    with pytest.raises(ValueError, match=r"the validation shards hold 3 rows, fewer than one "
                                         r"micro-batch per rank \(1 ranks x phase1\."
                                         r"micro_batch_size 4 = 4\)"):
        pretrain.run(config)
    assert not list((tmp_path / "run_small" / "checkpoints").glob("*"))  # no checkpoint
    # The same shards as a second phase: checked before the first phase takes a step too.
    good = make_config(data, tmp_path / "run_two", steps=2, num_workers=0).phases[0]
    two = dataclasses.replace(config, output_dir=str(tmp_path / "run_two"), phases=(
        good, dataclasses.replace(good, name="phase2", train_shards=str(small))))
    with pytest.raises(ValueError, match=r"the validation shards hold 3 rows"):
        pretrain.run(two)
    assert not list((tmp_path / "run_two" / "checkpoints").glob("*"))

    corrupt = tmp_path / "corrupt"
    write_shards(rows, corrupt, {"train": [20, 20], "validation": [16]}, vocab_size, 128, 16)
    with tarfile.open(corrupt / "validation-000000.tar", "w") as tar:
        info = tarfile.TarInfo("000000-000000.rows.npz")
        info.size = 5
        tar.addfile(info, fileobj=io.BytesIO(b"notnp"))
    config = dataclasses.replace(config, output_dir=str(tmp_path / "run_corrupt"), phases=(
        dataclasses.replace(config.phases[0], train_shards=str(corrupt)),))
    with pytest.raises(ValueError, match=r"validation-000000\.tar: member 000000-000000: cannot"):
        pretrain.run(config)
    latest = tmp_path / "run_corrupt" / "checkpoints" / "latest"
    assert latest.read_text() == "00-phase1-step00000002"
    assert (latest.parent / "00-phase1-step00000002" / "training_state.json").exists()

    # Good validation shards: the resumed run redoes the evaluation the failure skipped (the
    # phase's last step, so there is nothing left to train); it equals an uninterrupted run's.
    repaired = tmp_path / "repaired"
    write_shards(rows, repaired, {"train": [20, 20], "validation": [16]}, vocab_size, 128, 16)
    config = dataclasses.replace(config, phases=(
        dataclasses.replace(config.phases[0], validation_shards=str(repaired)),))
    assert "validation" not in {r["split"] for r in pretrain.read_metrics(config.output_dir)}
    pretrain.run(config)
    clean = dataclasses.replace(config, output_dir=str(tmp_path / "run_clean"))
    pretrain.run(clean)
    for run in (config, clean):
        assert [(r["split"], r["step"]) for r in pretrain.read_metrics(run.output_dir)] == [
            ("train", 1), ("train", 2), ("validation", 2)]
    assert timeless_metrics(config.output_dir) == timeless_metrics(clean.output_dir)


def timeless_metrics(output) -> list[dict]:
    """metrics.jsonl without the wall-clock rates, which differ from run to run."""
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "samples_per_s")}
            for r in pretrain.read_metrics(str(output))]


def test_a_resumed_run_redoes_the_evaluation_a_kill_skipped(data, tmp_path):
    """Killed after step 2's checkpoint, before its evaluation was logged: resuming evaluates
    step 2 first, then trains on; the metrics equal the uninterrupted run's."""
    changes = {"steps": 4, "eval_every": 2, "num_workers": 0, "dropout": 0.1}
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


def pretrain_rows(data) -> list:
    from tests.support.shard_fixtures import read_rows
    return read_rows(data["uneven"])



def test_a_checkpoint_whose_config_is_no_longer_accepted_is_named(tmp_path):
    """Session-2 base runs saved bf16 at ZeRO stage 0, refused since: resuming one names the
    checkpoint's config file instead of failing on a config the user never wrote."""
    old = {**cfg.to_dict(cfg.tiny()), "precision": "bf16", "zero_stage": 0}
    (tmp_path / "step-10").mkdir()
    (tmp_path / "step-10" / "config.json").write_text(json.dumps(old))
    state = pretrain.CheckpointState("step-10", 0, "phase1", 10, 1, 0, {})
    with pytest.raises(ValueError, match=r"step-10/config\.json: this checkpoint's config is no "
                                         r"longer accepted \(precision=bf16 cannot"):
        pretrain.check_resume(cfg.tiny(), str(tmp_path), state)


def test_export_takes_casing_from_the_shards_then_the_vocabulary(tmp_path):
    """A bare cased vocab.txt (no tokenizer_config.json) with shards made by make_shards
    --do_lower_case=false exports a tokenizer that keeps case; a contradiction is refused."""
    bare, uncased = tmp_path / "bare", tmp_path / "uncased"
    for folder in (bare, uncased):
        folder.mkdir()
        (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (uncased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))

    def manifest(lower):
        return {"options": {"job": {"do_lower_case": lower}}}
    assert pretrain.export_do_lower_case(manifest(False), str(bare)) is False
    assert pretrain.export_do_lower_case(manifest(True), str(uncased)) is True
    assert pretrain.export_do_lower_case({}, str(bare)) is True  # BERT's uncased default
    with pytest.raises(ValueError, match="made with do_lower_case=False but .*uncased/"
                                         "tokenizer_config.json says do_lower_case=True"):
        pretrain.export_do_lower_case(manifest(False), str(uncased))


@pytest.mark.parametrize(("assignment", "field", "expected"), [
    ("learning_rate=1e-4", None, None),  # unknown at the top level: a phase field
    ("adam_epsilon=1e-8", "adam_epsilon", 1e-8),
    ("dynamic_masking=yes", "dynamic_masking", True),
    ("export_hf=false", "export_hf", False),
    ("output_dir=2024", "output_dir", "2024"),  # text as given, not YAML's int
    ("vocab_dir=~", "vocab_dir", "~"),  # not YAML's null
    ("seed=7", "seed", 7),
])
def test_set_converts_text_with_the_flows_converter(assignment, field, expected):
    """One converter for `bert-pretrain --set` and the flow's `--set` (pipelines.settings)."""
    if field is None:
        with pytest.raises(ValueError, match="unknown field"):
            cfg.apply_overrides(cfg.tiny(), [assignment])
        return
    value = getattr(cfg.apply_overrides(cfg.tiny(), [assignment]), field)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(("assignment", "message"), [
    ("seed=1.5", "--set seed='1.5': '1.5' is not an int"),
    ("export_hf=maybe", "--set export_hf='maybe': 'maybe' is not a bool"),
    ("phase1.learning_rate=fast", "--set phases.0.learning_rate='fast': 'fast' is not a number"),
    ("phase1.steps=inf", "--set phases.0.steps='inf': 'inf' is not an int"),
    ("seed=7.0", "--set seed='7.0': '7.0' is not an int"),
])
def test_set_rejects_values_of_the_wrong_type_naming_them(assignment, message):
    with pytest.raises(ValueError) as error:
        cfg.apply_overrides(cfg.tiny(), [assignment])
    assert message in str(error.value)


def test_every_phases_inputs_are_checked_before_the_first_step(data, tmp_path):
    """Another vocabulary of the same size, phase-2 shards of the wrong length, a truncated
    shard: each stops the run at its start, naming the phase and the file, with no checkpoint."""
    learn = make_config(data, tmp_path / "run", shards="learn", steps=2, num_workers=0)
    other_vocab = tmp_path / "other_vocab"
    shutil.copytree(data["vocab"], other_vocab)
    tokens = (other_vocab / "vocab.txt").read_text().split("\n")
    tokens[-3], tokens[-2] = tokens[-2], tokens[-3]  # same size, two ids swapped
    (other_vocab / "vocab.txt").write_text("\n".join(tokens))
    wrong_length = dataclasses.replace(learn.phases[0], name="phase2", max_seq_length=512)
    truncated = tmp_path / "truncated"
    shutil.copytree(data["learn"], truncated)
    shard = max(truncated.glob("train-*.tar"))
    shard.write_bytes(shard.read_bytes()[:10_000])
    cases = [
        (dataclasses.replace(learn, vocab_dir=str(other_vocab)),
         (r"phase1\.train_shards=.*: shards made with the vocabulary .*vocab\.txt "
          r"\(sha256 \w{12}\), but vocab_dir=.*other_vocab holds another")),
        (dataclasses.replace(learn, phases=(learn.phases[0], wrong_length)),
         (r"phase2\.train_shards=.*: shards of max_seq_length 128, but "
          r"phase2\.max_seq_length is 512")),
        (dataclasses.replace(learn, phases=(dataclasses.replace(
            learn.phases[0], train_shards=str(truncated)),)),
         (rf"{shard.name}: 10000 bytes, the manifest records \d+: truncated or replaced; "
          r"check the folder with `python -m pipelines.verify_shards <folder>`")),
    ]
    for i, (config, message) in enumerate(cases):
        config = dataclasses.replace(config, output_dir=str(tmp_path / f"run{i}"))
        with pytest.raises(ValueError, match=message):
            pretrain.run(config)
        assert not (tmp_path / f"run{i}" / "checkpoints").exists()


def test_a_shard_that_breaks_while_read_is_named(data, tmp_path):
    """A shard whose size the manifest does not record (or a remote one) truncated: the loader
    names it when webdataset cannot read it, never skips it."""
    rows = list(pretrain_rows(data))
    vocab_size = len((data["vocab"] / "vocab.txt").read_text().split())
    folder = tmp_path / "shards"
    write_shards(rows, folder, {"train": [40, 40]}, vocab_size, 128, 8)
    shard = folder / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5_000])
    for workers in (0, 1):  # in a loader worker too, where torch wraps the message
        loader = pretrain.ShardLoader(LoaderConfig(str(folder), 8, 128, shuffle_buffer=0,
                                                   num_workers=workers))
        with pytest.raises(ValueError) as error:
            for _ in zip(range(20), iter(loader)):
                pass
        assert re.fullmatch(r".*/train-000001\.tar: cannot read the shard \(\w+Error: .*\); it "
                            r"is truncated or corrupt: check the folder with `python -m "
                            r"pipelines\.verify_shards <folder>`", str(error.value)), workers
    # A shard the manifest lists but that is gone: "cannot open", not "truncated".
    (folder / "train-000001.tar").unlink()
    loader = pretrain.ShardLoader(LoaderConfig(str(folder), 8, 128, shuffle_buffer=0))
    with pytest.raises(ValueError) as error:
        for _ in zip(range(20), iter(loader)):
            pass
    assert re.fullmatch(r".*/train-000001\.tar: cannot open the shard \(FileNotFoundError: No "
                        r"such file or directory\); check the folder .*", str(error.value))


def test_a_config_files_phases_merge_into_the_presets_phases_by_name(tmp_path, caplog):
    """`{name: phase2, ...}` alone keeps phase 2's 512 tokens and learning rate (it used to
    inherit phase 1's by position), and leaving phase 1 out is said, not silent."""
    path = tmp_path / "run.yaml"
    path.write_text("phases:\n  - {name: phase2, steps: 50, warmup_steps: 5}\n")
    base = cfg.base()
    with caplog.at_level(logging.WARNING, logger="training.config"):
        config = cfg.resolve("base", str(path))
    (phase,) = config.phases
    assert (phase.name, phase.steps, phase.warmup_steps) == ("phase2", 50, 5)
    assert (phase.max_seq_length, phase.learning_rate, phase.micro_batch_size) == (
        base.phases[1].max_seq_length, base.phases[1].learning_rate,
        base.phases[1].micro_batch_size) == (512, 1e-4, 32)
    assert "the config file's phases ['phase2'] leave out the preset's ['phase1']: not run" \
        in caplog.text
    # Unnamed entries still merge by position; a new name starts from the defaults.
    path.write_text("phases:\n  - {steps: 7, warmup_steps: 0}\n  - {name: extra, steps: 3, "
                    "warmup_steps: 0, max_seq_length: 256}\n")
    first, extra = cfg.resolve("base", str(path)).phases
    assert (first.name, first.steps, first.max_seq_length) == ("phase1", 7, 128)
    assert (extra.name, extra.steps, extra.max_seq_length, extra.learning_rate) == (
        "extra", 3, 256, cfg.PhaseConfig().learning_rate)
    # A run's saved config (read on every resume) is no user file: no warning there.
    caplog.clear()
    saved = tmp_path / "config.json"
    cfg.save(config, str(saved))
    with caplog.at_level(logging.WARNING, logger="training.config"):
        assert cfg.load_saved(str(saved)) == config
    assert "leave out" not in caplog.text


def test_bad_settings_and_inputs_are_one_line_errors_not_tracebacks(tmp_path):
    """`bert-pretrain` with a bad value or a missing shard folder: exit 2 and the message
    naming the setting or folder, no traceback (BERT_DEBUG=1 would show it)."""
    command = [sys.executable, "-m", "training.pretrain", "--preset", "tiny",
               "--set", f"output_dir={tmp_path / 'run'}", "--set", "export_hf=false"]
    cases = [
        (["--set", "zero_stage=4"], "bert-pretrain: error: --set zero_stage: must be 0, 1, 2 or 3"),
        (["--set", f"phase1.train_shards={tmp_path / 'nowhere'}"],
         (f"bert-pretrain: error: {tmp_path / 'nowhere' / 'manifest.json'}: cannot read the "
          "shard manifest")),
    ]
    for extra, message in cases:
        done = subprocess.run(command + extra, capture_output=True, text=True, timeout=300,
                              cwd=REPO, env=subprocess_env(), check=False)
        assert done.returncode == 2, done.stderr[-2000:]
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_config_file_typo_is_named_as_the_files_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lerning_rate: 1e-4\n")
    with pytest.raises(ValueError, match=r"run\.yaml: config key lerning_rate: unknown field"):
        cfg.resolve("tiny", str(path))
    path.write_text("phases:\n  - {name: phase1, warm_up_steps: 5}\n")
    with pytest.raises(ValueError, match=r"run\.yaml: config key phases\.0\.warm_up_steps: "
                                         r"unknown field"):
        cfg.resolve("tiny", str(path))


def test_a_resume_in_phase_2_needs_no_longer_phase_1s_shards(data, tmp_path):
    """Phase 1 done and its shards deleted (a common clean-up): the run resumes phase 2."""
    phase1_shards = tmp_path / "phase1_shards"
    shutil.copytree(data["learn"], phase1_shards)
    config = make_config(data, tmp_path / "run", shards="learn", steps=2, num_workers=0)
    first = dataclasses.replace(config.phases[0], train_shards=str(phase1_shards))
    config = dataclasses.replace(config, phases=(
        first, dataclasses.replace(config.phases[0], name="phase2")))
    assert pretrain.run(config, stop_after_steps=2)["complete"] is False
    shutil.rmtree(phase1_shards)
    result = pretrain.run(config)
    assert result["complete"] and result["last_checkpoint"] == "01-phase2-step00000002"


def test_phases_must_share_the_vocabulary_and_nsp(data, tmp_path):
    """Without vocab_dir to compare with, the phases are compared with each other."""
    config = make_config(data, tmp_path / "run", shards="learn", steps=2, num_workers=0,
                         vocab_dir="")
    cases = (("vocab_size", 999, "shards with vocab_size 999, but phase1's have 2000"),
             ("nsp", False, "shards with nsp False, but phase1's have True"))
    for key, value, message in cases:
        other = tmp_path / f"other_{key}"
        shutil.copytree(data["learn"], other)
        manifest = json.loads((other / "manifest.json").read_text())
        manifest[key] = value
        (other / "manifest.json").write_text(json.dumps(manifest))
        two = dataclasses.replace(config, phases=(config.phases[0], dataclasses.replace(
            config.phases[0], name="phase2", train_shards=str(other))))
        with pytest.raises(ValueError, match=rf"phase2\.train_shards=.*: {message}"):
            pretrain.check_phase_inputs(two)


def test_metric_counts_stay_exact_with_a_bf16_loss():
    """bf16 holds integers exactly only up to 256: counts are summed in float64 instead."""
    from types import SimpleNamespace

    loss = torch.tensor(2.5, dtype=torch.bfloat16)
    out = SimpleNamespace(loss=loss, mlm_loss=loss, mlm_correct=torch.tensor(1001),
                          mlm_count=torch.tensor(3001), nsp_loss=None)
    batch = {"attention_mask": torch.ones(300, 128, dtype=torch.long),
             "input_ids": torch.zeros(300, 128, dtype=torch.long)}
    sums = dict(zip(pretrain.METRIC_KEYS, pretrain.metric_sums(out, batch).tolist()))
    assert sums == {"loss": 2.5, "mlm_loss": 2.5, "mlm_correct": 1001.0, "mlm_count": 3001.0,
                    "nsp_loss": 0.0, "nsp_correct": 0.0, "nsp_count": 0.0,
                    "tokens": 38400.0, "samples": 300.0, "micro_batches": 1.0}


def test_gpu_runs_pin_their_training_batches(data, tmp_path):
    """On GPUs the training loader pins its batches (so `to(device, non_blocking=True)` copies
    overlap with compute); on CPU nothing is pinned."""
    config = make_config(data, tmp_path / "run")
    phase = config.phases[0]
    for on_gpu in (False, True):
        dist = pretrain.Dist(rank=0, world_size=1, on_gpu=on_gpu)
        assert pretrain.build_loader(config, phase, dist).pin_memory is on_gpu
        assert pretrain.build_loader(config, phase, dist, validation=True).pin_memory is False


def _checks_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Rank `rank` of 2 (gloo): runs on_all_ranks with checks that fail on rank 1 only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    dist = pretrain.Dist(rank, 2, on_gpu=False)
    shard = Path(out_dir) / "train-000000.tar"

    def user_error_on_rank_1():  # our check, on rank 1's own (broken) copy
        from training.loader import ShardInfo, check_shard_files
        check_shard_files([ShardInfo(shard.name, str(shard), 1, 0, 99 if rank else 10)])

    def library_error_on_rank_1():
        return json.loads("{" if rank else "{}")

    seen = {}
    for name, check, agree in (("user", user_error_on_rank_1, None),
                               ("library", library_error_on_rank_1, None),
                               ("disagree", lambda: rank, "the rank's number"),
                               ("agree", lambda: "same", "a constant")):
        try:
            seen[name] = ["ok", pretrain.on_all_ranks(dist, check, agree=agree)]
        except Exception as e:  # noqa: BLE001 (recorded for the test to compare)
            seen[name] = [type(e).__name__, str(e)]
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(seen))
    torch.distributed.destroy_process_group()


def test_start_of_run_checks_fail_on_every_rank_when_one_rank_fails(tmp_path):
    """A check failing on one rank only (its own copy of a file) fails on all ranks, so none
    waits at the next collective: the failing rank with its error, the others naming it."""
    import socket

    (tmp_path / "train-000000.tar").write_bytes(b"x" * 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_checks_on_two_ranks, args=(port, str(tmp_path)), nprocs=2)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    shard = tmp_path / "train-000000.tar"
    message = (f"{shard}: 10 bytes, the manifest records 99: truncated or replaced; check the "
               "folder with `python -m pipelines.verify_shards <folder>`")
    assert rank1["user"] == ["ValueError", message]
    assert rank0["user"] == ["OtherRankError", f"on rank 1: {rank1['user'][1]}"]
    assert rank1["library"][0] == "JSONDecodeError"
    assert rank0["library"] == ["RuntimeError",
                                f"on rank 1: JSONDecodeError: {rank1['library'][1]}"]
    disagree = ("the ranks disagree on the rank's number ([0, 1], by rank): give every node the "
                "same files")
    for seen in (rank0, rank1):
        assert seen["disagree"] == ["ValueError", disagree]
        assert seen["agree"] == ["ok", "same"]


def test_a_vocabulary_rewritten_in_place_is_caught_and_a_crlf_copy_is_not(data, tmp_path):
    """The manifest names the vocabulary file it hashed. Rewritten in place since (two ids
    swapped, same size) it no longer matches its hash: refused, although shards and vocab_dir
    name the same file. A copy with CRLF line endings hashes differently but holds the same
    tokens: accepted."""
    vocab = tmp_path / "vocab"
    shutil.copytree(data["vocab"], vocab)
    shards = tmp_path / "shards"
    shutil.copytree(data["learn"], shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["vocab"]["path"] = str(vocab / "vocab.txt")
    (shards / "manifest.json").write_text(json.dumps(manifest))
    config = make_config(data, tmp_path / "run", shards="learn", vocab_dir=str(vocab))
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(shards)),))
    pretrain.check_phase_inputs(config)  # the very file it hashed
    crlf = tmp_path / "crlf"
    shutil.copytree(data["vocab"], crlf)
    text = (crlf / "vocab.txt").read_text()
    (crlf / "vocab.txt").write_bytes(text.replace("\n", "\r\n").encode())
    pretrain.check_phase_inputs(dataclasses.replace(config, vocab_dir=str(crlf)))
    tokens = text.split("\n")
    tokens[-3], tokens[-2] = tokens[-2], tokens[-3]
    (vocab / "vocab.txt").write_text("\n".join(tokens))
    with pytest.raises(ValueError, match="shards made with the vocabulary .* holds another"):
        pretrain.check_phase_inputs(config)


def test_a_config_file_that_does_not_parse_is_named(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"zero_stage": 1,}')
    with pytest.raises(ValueError, match=r"run\.json: not valid JSON \(Expecting property name"):
        cfg.resolve("tiny", str(path))
    path = tmp_path / "run.yaml"
    path.write_text("phases: [unclosed\n")
    with pytest.raises(ValueError, match=r"run\.yaml: not valid YAML"):
        cfg.resolve("tiny", str(path))
