"""Learning-rate schedules (training/optim.py): warmup-stable-decay's exact rates in its three
decay shapes, on real DeepSpeed steps, and its settings' one-line errors; BERT's linear schedule
stays the default."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from tests.training.pretrain_runs import final_weights, make_config, train_losses
from training import config as cfg
from training import pretrain
from training.config import PhaseConfig
from training.optim import LinearWarmupDecay, WarmupStableDecay


def _rates(schedule) -> list[float]:
    return [schedule.lr_at(s) for s in range(schedule.total_steps + 1)]


@pytest.mark.parametrize("shape, decay", [
    ("linear", [1.0, 0.75, 0.5, 0.25, 0.0]),
    ("1-sqrt", [1.0, 0.5, 1 - math.sqrt(0.5), 1 - math.sqrt(0.75), 0.0]),
    ("cosine", [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)),
                0.0]),
])
def test_wsd_warms_up_holds_the_peak_then_decays_in_its_shape(shape, decay):
    """10 steps: 2 of warmup, 4 at the peak, the last 4 decaying; step 10 is after the last."""
    optimizer = torch.optim.SGD([torch.zeros(1)], lr=1.0)
    schedule = WarmupStableDecay(optimizer, 2.0, 2, 10, decay_steps=4, shape=shape)
    rates = _rates(schedule)
    assert rates[:6] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert rates[6:] == pytest.approx([2.0 * x for x in decay], abs=1e-15)
    stable = WarmupStableDecay(optimizer, 2.0, 2, 10, decay_steps=0)
    assert _rates(stable)[2:] == [2.0] * 9  # a stable phase ends at the peak


def test_the_linear_schedule_is_unchanged_and_the_default():
    assert cfg.tiny().optimizer.schedule == "linear"
    schedule = LinearWarmupDecay(torch.optim.SGD([torch.zeros(1)], lr=1.0), 2.0, 2, 10)
    assert _rates(schedule) == [0.0, 1.0] + [2.0 * (10 - s) / 8 for s in range(2, 11)]


def test_a_wsd_run_logs_the_schedules_rates_on_real_steps(data, tmp_path):
    phase = PhaseConfig(name="phase1", train_shards=str(data["uneven"]), max_seq_length=128,
                        micro_batch_size=4, global_batch_size=8, steps=9, warmup_steps=2,
                        decay_steps=3, learning_rate=2e-3)
    pretrain.run(make_config(data, tmp_path, phases=(phase,), optimizer={"schedule": "wsd"}))
    train = [r for r in pretrain.read_metrics(str(tmp_path)) if r["split"] == "train"]
    # the rate logged after step s is the next step's: WarmupStableDecay.lr_at(s), exactly
    expected = [1e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3 * (1 - math.sqrt(1 / 3)),
                2e-3 * (1 - math.sqrt(2 / 3)), 0.0]
    assert [(r["step"], r["lr"]) for r in train] == list(zip(range(1, 10), expected))


@pytest.mark.parametrize("setting, message", [
    ("phase1.decay_steps=600", ("--set phase1.decay_steps: must be in [0, steps - warmup_steps "
                               "= 540], got 600")),
    ("optimizer.decay_shape=step", ("--set optimizer.decay_shape='step': must be one of linear, "
                                   "1-sqrt or cosine")),
    ("optimizer.schedule=onecycle", ("--set optimizer.schedule='onecycle': must be one of linear "
                                    "or wsd")),
    ("phase2.decay_steps=6", ("--set phase2.decay_steps: needs optimizer.schedule=wsd (the linear "
                              "schedule decays over the whole phase), got 6")),
])
def test_bad_schedule_settings_are_one_line(setting, message):
    with pytest.raises(ValueError) as refused:
        cfg.resolve("tiny", None, [setting])
    assert str(refused.value) == message


def test_a_phase_sets_the_rope_base_of_its_global_layers(data, tmp_path):
    """Context extension: phase 2 at 512 tokens with the global layers' RoPE base raised; the
    phase's model and the export carry it, the local layers keep theirs. BERT has none to set."""
    import dataclasses
    import json

    phases = (PhaseConfig(name="phase1", train_shards=str(data["uneven"]), max_seq_length=128,
                          micro_batch_size=4, global_batch_size=4, steps=1, warmup_steps=0),
              PhaseConfig(name="phase2", train_shards=str(data["long"]), max_seq_length=512,
                          micro_batch_size=2, global_batch_size=2, steps=1, warmup_steps=0,
                          rope_theta=320000.0))
    config = make_config(data, tmp_path, model={"preset": "modernbert_tiny", "dropout": 0.0},
                         objective={"next_sentence": False}, cadence={"export_hf": True})
    config = dataclasses.replace(config, phases=phases)
    manifest = json.loads((data["long"] / "manifest.json").read_text())
    first, second = (pretrain.build_model(config, manifest, phase=p).config for p in phases)
    assert (first.global_rope_theta, second.global_rope_theta) == (160000.0, 320000.0)
    assert first.local_rope_theta == second.local_rope_theta == 10000.0
    pretrain.run(config)
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["rope_parameters"]["full_attention"]["rope_theta"] == 320000.0
    assert exported["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    with pytest.raises(ValueError) as refused:
        cfg.resolve("tiny", None, ["phase2.rope_theta=320000"])
    assert str(refused.value) == ("--set phase2.rope_theta: the bert_tiny encoder has no rotary "
                                  "positions (model.arch=modernbert has)")


def test_the_masking_rate_schedule_masks_each_batch_at_its_steps_rate(data, tmp_path):
    """0.30 -> 0.10 over 5 steps of 2 micro-batches (2 loader workers, 2 epochs of the uneven
    shards): each batch is what a fixed-share remasker at its step's rate gives, the run logs
    the rate each step, and a stopped and resumed run trains the same losses."""
    from training.loader import LoaderConfig, ShardLoader
    from training.remasking import MaskSchedule, Remasker

    schedule = MaskSchedule(0.30, 0.10, steps=5, micro_batches_per_step=2)
    assert [schedule.rate(s) for s in range(6)] == pytest.approx(
        [0.30, 0.25, 0.20, 0.15, 0.10, 0.10])
    remasker = Remasker.from_vocab(str(data["vocab"]), seed=7, recount=True)
    base = LoaderConfig(source=str(data["uneven"]), batch_size=4, max_seq_length=128,
                        num_workers=2, seed=7, shuffle_buffer=16, remasker=remasker)
    scheduled = ShardLoader(dataclasses.replace(base, mask_schedule=schedule))
    counts = []
    for index, batch in zip(range(12), scheduled):
        rate = schedule.rate_of_batch(index)
        fixed = ShardLoader(dataclasses.replace(base, remasker=dataclasses.replace(
            remasker, masking=dataclasses.replace(remasker.masking, masked_lm_prob=rate))))
        expected = next(itertools.islice(fixed, index, None))
        for key in ("input_ids", "masked_lm_positions", "masked_lm_ids"):
            assert torch.equal(batch[key], expected[key]), (index, key)
        counts.append(int((batch["masked_lm_ids"] >= 0).sum()))
    assert counts[0] > counts[9] > 0  # 30% of a batch's tokens, then 10%

    def config(output):
        return make_config(data, output, shards="learn", steps=5, cadence={"checkpoint_every": 2}, data={
            "num_workers": 2, "dynamic_masking": True, "dynamic_masked_lm_prob": 0.3,
            "dynamic_masked_lm_prob_end": 0.1})

    full, parts = tmp_path / "full", tmp_path / "parts"
    pretrain.run(config(full))
    pretrain.run(config(parts), stop_after_steps=3)
    pretrain.run(config(parts))
    train = [r for r in pretrain.read_metrics(str(full)) if r["split"] == "train"]
    assert [r["mask_rate"] for r in train] == pytest.approx([0.30, 0.25, 0.20, 0.15, 0.10])
    assert train_losses(parts) == train_losses(full)  # bit-exact across the stop


def test_the_batch_warms_up_over_tokens_and_a_resume_keeps_it(data, tmp_path):
    """4 rows a step growing to 8 over 2,000 tokens (128 a row): steps 0-3 see 0, 512, 1,024
    and 1,536 tokens (4 + 4 x share rounds down to 4), step 4 on trains 8. A run stopped at
    step 3, before the batch grows, resumes to the uninterrupted run's losses and weights."""
    from training.optim import BatchWarmup

    assert BatchWarmup(4, 8, 2000, 128, 4).rows(6) == [4, 4, 4, 4, 8, 8]
    assert BatchWarmup(2, 16, 1000, 100, 2).rows(6) == [2, 4, 10, 16, 16, 16]  # 0, 200, 600

    def config(output):
        config = make_config(data, output, steps=7, cadence={"checkpoint_every": 3})
        return dataclasses.replace(config, phases=(dataclasses.replace(
            config.phases[0], batch_warmup_rows=4, batch_warmup_tokens=2000),))

    full, parts = tmp_path / "full", tmp_path / "parts"
    pretrain.run(config(full))
    pretrain.run(config(parts), stop_after_steps=3)
    pretrain.run(config(parts))
    train = [r for r in pretrain.read_metrics(str(full)) if r["split"] == "train"]
    assert [r["batch_rows"] for r in train] == [4, 4, 4, 4, 8, 8, 8]
    assert train_losses(parts) == train_losses(full)
    weights = final_weights(full)
    for key, value in final_weights(parts).items():
        assert torch.equal(value, weights[key]), key
    with pytest.raises(ValueError) as refused:
        cfg.resolve("tiny", None, ["phase1.batch_warmup_rows=64", "phase1.batch_warmup_tokens=1"])
    assert str(refused.value) == ("--set phase1.batch_warmup_rows: must be a multiple of "
                                  "micro_batch_size=32 in [0, global_batch_size=32], got 64")
