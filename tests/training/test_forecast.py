"""The forecast before a launch (training/forecast.py, `bert-pretrain --plan`): the FLOP count
against a hand count, the hours of the measured H200 profile and of the MFU-based ones, disk
and memory, `--calibrate` with real steps, and a bad profile as one line."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.bert import bert_base
from model.modernbert import modernbert_base, modernbert_tiny
from model.modernbert_hf import hf_config
from training import config as cfg
from training import forecast as fc
from training.memory import estimate, parameter_count

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}


def bert_pretrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.pretrain", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


def test_flops_of_a_bert_base_row_at_128_tokens_match_a_hand_count():
    # L=12, H=768, FF=3072, T=128, V=30522, P=20:
    # projections + feed-forward 6*12*(4*768^2 + 2*768*3072)*128 = 65,229,815,808
    # attention's two T x T products 12*12*128^2*768              =  1,811,939,328
    # MLM head at 20 positions 6*(768^2 + 30522*768)*20           =  2,883,686,400
    assert fc.model_flops_per_row(bert_base(), 128, 20) == 69_925_441_536


def test_flops_of_a_modernbert_row_count_local_layers_over_their_window():
    # modernbert_tiny with V=512 and a 16-token window: L=3 (layer 0 global, 1 and 2 local, a
    # query seeing 16 + 1 keys), H=128, GLU I=192, T=64, P=10:
    # projections + GLU 6*3*(4*128^2 + 3*128*192)*64  = 160,432,128
    # attention 12*128*(64 + 17 + 17)*64              =   9,633,792
    # MLM head at 10 positions 6*(128^2 + 512*128)*10 =   4,915,200
    config = modernbert_tiny(vocab_size=512, local_attention=16)
    assert fc.model_flops_per_row(config, 64, 10) == 174_981_120
    # a window covering the row: every layer attends over all 64 tokens
    assert fc.model_flops_per_row(config.replace(local_attention=128), 64, 10) == \
        160_432_128 + 12 * 128 * 64 * 3 * 64 + 4_915_200


def test_modernbert_base_parameters_are_transformers_masked_lm():
    """The estimate counts the pre-training model as ModernBERT trains it: transformers'
    ModernBertForMaskedLM (its `head` is our MLM transform and our pooler, one module), no
    next-sentence head unless asked for (2 H + 2)."""
    import torch
    import transformers

    config = modernbert_base()
    with torch.device("meta"):
        theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
            **hf_config(config)))
    masked_lm = sum(p.numel() for p in theirs.parameters())
    H = config.hidden_size
    assert parameter_count(config) == masked_lm == 149_655_232
    assert parameter_count(config, next_sentence=True) == masked_lm + 2 * H + 2


def test_modernbert_has_no_measured_rate_and_the_plan_says_so():
    """No ModernBERT step was measured on a GPU, and BERT's MFU says nothing of it: the plan
    names the missing measurement instead of a figure. Its embedding is padded to a multiple of
    64 rows as the run builds it, and its MLM head masks 30% (the memory estimate's)."""
    shape = fc.run_shape(cfg.apply_overrides(cfg.tiny(), ["model.arch=modernbert"]),
                         vocab_size=30522)
    assert (shape.model.vocab_size, shape.model.embedding_rows) == (30522, 30528)
    result = fc.forecast(shape, [None, None], fc.Hardware("h200", gpus=1))
    phase = result["phases"][0]
    assert (phase["rows_per_s_per_gpu"], phase["hours"], result["hours"]) == (None, None, None)
    assert phase["rate_basis"] == ("no measured rate for modernbert_tiny (measured: bert_base, "
                                   "bert_large, bert_tiny); --calibrate N measures it here")
    assert "rate: no measured rate for modernbert_tiny" in fc.render(result)
    assert phase["peak_memory_per_rank_bytes"] == estimate(
        shape.model, 128, shape.phases[0].micro_batch_size, precision=shape.precision,
        zero_stage=shape.zero_stage).total


def test_bert_large_at_128_on_h200_takes_steps_times_batch_over_898_rows_per_s():
    shape = fc.run_shape(cfg.large())
    result = fc.forecast(shape, [None, None], fc.Hardware("h200", gpus=1))
    phase1, phase2 = result["phases"]
    assert phase1["rows_per_s_per_gpu"] == 898.0
    assert phase1["hours"] == 900_000 * 256 / 898 / 3600
    assert phase2["hours"] == 100_000 * 256 / 360 / 3600
    assert phase1["rate_basis"] == "measured (RESULTS.md 16e)"
    assert result["hours"] == phase1["hours"] + phase2["hours"]
    assert result["cost"] is None  # no price given


def test_eight_gpus_scale_linearly_and_the_price_gives_the_cost():
    shape = fc.run_shape(cfg.large())
    one = fc.forecast(shape, [None, None], fc.Hardware("h200", gpus=1))
    eight = fc.forecast(shape, [None, None], fc.Hardware("h200", gpus=8, price_per_gpu_hour=2.5))
    assert eight["phases"][0]["hours"] == 900_000 * 256 / (898 * 8) / 3600
    assert eight["gpu_hours"] == eight["hours"] * 8
    assert eight["cost"] == eight["hours"] * 8 * 2.5
    assert one["cost"] is None
    assert "8 GPU(s), rows/s scaling linearly with them" in eight["assumptions"]


def test_gpus_not_measured_take_the_h200_mfu_times_their_datasheet_peak():
    shape = fc.run_shape(cfg.large())
    rates = {p: fc.forecast(shape, [None, None], fc.Hardware(p, 1))["phases"][0]
             ["rows_per_s_per_gpu"] for p in ("h200", "h100", "a100-80gb", "a100-40gb")}
    assert rates["h100"] == pytest.approx(898.0, rel=1e-12)  # same 989 TF/s peak, same MFU
    assert rates["a100-80gb"] == rates["a100-40gb"] == pytest.approx(898.0 * 312 / 989,
                                                                     rel=1e-12)
    basis = fc.forecast(shape, [None, None], fc.Hardware("a100-80gb", 1))["phases"][0]
    assert basis["rate_basis"] == ("MFU 0.218 (h200 bert_large @128, RESULTS.md 16e) x 312 TF/s "
                                   "(datasheet)")


def test_memory_and_disk_come_from_the_model_states_and_kept_checkpoints():
    shape = fc.run_shape(cfg.large())
    result = fc.forecast(shape, [None, None], fc.Hardware("h200", gpus=8))
    params = parameter_count(shape.model)
    assert result["parameters"] == params == 336_226_108 + 6 * 1024  # 30,522 -> 30,528 rows
    # bf16 module weights 2 + fp32 masters and Adam's two moments 12, 3 kept, fp32 export 4
    assert result["disk"]["checkpoint_bytes"] == params * 14
    assert result["disk"]["checkpoints_total_bytes"] == params * 14 * 3 + params * 4
    assert result["disk"]["shards_bytes"] is None  # no shards, no estimate
    assert result["phases"][1]["peak_memory_per_rank_bytes"] == estimate(
        shape.model, 512, 32, ranks=8, precision="bf16", zero_stage=2).total


def test_built_shards_give_the_instances_epochs_and_disk(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text(json.dumps({"shards": [
        {"split": "train", "num_instances": 300, "num_rows": 250, "num_tokens": 30_000,
         "bytes": 140_000},
        {"split": "train", "num_instances": 100, "num_rows": 70, "num_tokens": 9_000,
         "bytes": 40_000},
        {"split": "validation", "num_instances": 50, "num_rows": 50, "num_tokens": 5_000,
         "bytes": 20_000}]}))
    data = fc.shards_data(str(shards))
    assert (data.instances, data.rows, data.tokens, data.bytes) == (400, 320, 39_000, 180_000)
    shape = fc.run_shape(cfg.tiny())
    result = fc.forecast(shape, [data, None], fc.Hardware("h200", gpus=1))
    assert result["phases"][0]["epochs"] == 600 * 32 / 320
    assert result["disk"]["shards_bytes"] is None  # phase 2 unknown


def test_estimated_instances_are_dupe_factor_tokens_over_length_times_fill():
    data = fc.estimate_data(4.19e9, 128, dupe_factor=10)
    assert data.tokens == 10_000_000_000
    assert data.instances == round(10e9 / (128 * 0.914))
    assert "fill 0.914" in data.source


def test_plan_prints_the_forecast_and_starts_nothing(tmp_path):
    run = bert_pretrain("--preset", "large", "--plan", "--json", "--hardware", "h200",
                        "--gpus", "8", "--set", f"output_dir={tmp_path}")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["gpus"] == 8 and result["hardware"] == "h200"
    assert result["phases"][0]["hours"] == 900_000 * 256 / (898 * 8) / 3600
    assert list(tmp_path.iterdir()) == []  # no checkpoint, config or metrics written


def test_an_unknown_profile_is_one_line_listing_the_profiles():
    run = bert_pretrain("--preset", "tiny", "--plan", "--hardware", "nosuch")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        ("bert-pretrain: error: --hardware 'nosuch': unknown profile (known: h200, h100, "
        "a100-80gb, a100-40gb, cpu-this-machine)")]


def test_calibrate_runs_real_steps_and_saves_the_measured_rate(tmp_path):
    run = bert_pretrain("--preset", "tiny", "--plan", "--calibrate", "3",
                        "--set", f"output_dir={tmp_path}")
    assert run.returncode == 0, run.stderr
    saved = json.loads((tmp_path / "forecast.json").read_text())
    rate = saved["calibrated"]["rows_per_s"]
    assert saved["calibrated"]["steps"] == 3 and rate > 0
    assert saved["phases"][0]["rows_per_s_per_gpu"] == rate
    assert saved["phases"][0]["rate_basis"] == "calibrated (measured here)"
    assert saved["phases"][0]["hours"] == 600 * 32 / rate / 3600
    assert f"Saved to {tmp_path}/forecast.json" in run.stdout


def test_the_flags_are_declared_once_for_both_commands():
    from flows.cli import build_parser as dag_parser
    from training.launch import build_parser as pretrain_parser

    flags = {"--plan", "--hardware", "--gpus", "--price_per_gpu_hour", "--calibrate",
             "--input_bytes", "--json"}
    for parser in (dag_parser(), pretrain_parser()):
        assert flags <= set(parser._option_string_actions)
    args = argparse.Namespace(hardware="h100", gpus=None, price_per_gpu_hour=0.0, calibrate=0)
    assert fc.hardware_from_args(args, default_gpus=8) == fc.Hardware("h100", 8, 0.0)


@pytest.mark.parametrize("cpu_has_bf16", [True, False])
def test_auto_precision_is_the_one_the_trainer_takes_on_the_forecasts_hardware(cpu_has_bf16,
                                                                             monkeypatch):
    """A GPU profile trains in bf16 under ZeRO; `cpu-this-machine` as the trainer decides on
    this CPU: bf16 where oneDNN multiplies it natively (AMX/AVX-512), fp32 on AVX2-only."""
    from training import preflight

    monkeypatch.setattr(preflight, "bf16_hardware", lambda on_gpu: cpu_has_bf16)
    config = cfg.tiny()
    shape = fc.run_shape(config)
    assert shape.precision == "auto"
    here = fc.concrete_precision(shape, fc.Hardware("cpu-this-machine", 1)).precision
    assert here == config.concrete_precision(cpu_has_bf16) == ("bf16" if cpu_has_bf16 else "fp32")
    assert fc.concrete_precision(shape, fc.Hardware("h200", 8)).precision == "bf16"
