"""The pre-training stage's forecast: `forecast.json` written into the stage's folder when the
flow starts it (`write_stage_forecast`: this machine's profile, and on a CPU a few measured
steps), and the report's table of it beside the run's own figures from `metrics.jsonl`
(`forecast_vs_actual`). `bert-dag --plan` (flows/plan.py) forecasts a whole run before its
launch with the same ranks (`launch_gpus`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

from flows.config import DagConfig
from training import forecast as fc

logger = logging.getLogger("flows")


def launch_gpus(cfg: DagConfig) -> int:
    """The run's ranks: `launch.nproc_per_node` x the hostfile's nodes (1 without one)."""
    nodes = 1
    if cfg.launch.hostfile and os.path.exists(cfg.launch.hostfile):
        with open(cfg.launch.hostfile, encoding="utf-8") as f:
            nodes = max(1, sum(1 for line in f if line.strip() and not line.startswith("#")))
    return cfg.launch.nproc_per_node * nodes


STAGE_CALIBRATION_STEPS = 3
"""Steps the flow's pretrain stage measures on a CPU before training (`write_stage_forecast`)."""


def write_stage_forecast(cfg: DagConfig, config, out: str) -> str | None:
    """The pre-training stage's forecast.json (`config`: the run's PretrainConfig, its shard
    folders filled in): this machine's profile and the launch's ranks. A CPU has no measured
    rate, so there `STAGE_CALIBRATION_STEPS` steps of the model measure one (seconds for the
    tiny preset) and the report has a forecast to set beside the actual figures; a GPU profile
    takes its measured or MFU-based rate. A forecast informs and never stops the training: one
    that fails is a warning."""
    try:
        shape = fc.run_shape(config)
        data = [fc.shards_data(p.train_shards) for p in shape.phases]
        hardware = fc.Hardware(fc.this_machine(), launch_gpus(cfg))
        import torch  # a CUDA context made here would hold memory beside the trainers
        if not fc.PROFILES[hardware.profile].memory_gib and not torch.cuda.is_available():
            hardware = dataclasses.replace(hardware, calibrated_rows_per_s=fc.calibrate(
                shape, STAGE_CALIBRATION_STEPS))
        return fc.write_forecast(out, fc.forecast(shape, data, hardware))
    except Exception as error:  # noqa: BLE001 (a forecast informs, never stops training)
        logger.warning("no forecast.json for %s: %s", out, error)
        return None


def actual_phases(run_dir: str) -> dict[str, dict]:
    """Per phase, from metrics.jsonl: steps, mean rows/s of the logged windows, and the hours
    of training they imply (steps x global batch / rows/s; evaluation and saving aside)."""
    from training.metrics import read_metrics

    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return {}
    phases: dict[str, dict] = {}
    for record in read_metrics(run_dir):
        if record.get("split") == "train" and "samples_per_s" in record:
            row = phases.setdefault(record["phase"], {"steps": 0, "rates": []})
            row["steps"] = max(row["steps"], record["step"])
            row["rates"].append(record["samples_per_s"])
    return {name: {"steps": row["steps"], "rows_per_s": sum(row["rates"]) / len(row["rates"])}
            for name, row in phases.items()}


def forecast_vs_actual(run_dir: str) -> list[str]:
    """Markdown table lines: the run's forecast.json beside its metrics ([] without one)."""
    path = os.path.join(run_dir, "forecast.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        forecast = json.load(f)
    actual = actual_phases(run_dir)
    lines = [f"Forecast on {forecast['gpus']} x {forecast['hardware']} (`{path}`).", "",
             "| phase | steps | forecast rows/s | actual rows/s | forecast hours | actual hours |",
             "|---|---:|---:|---:|---:|---:|"]
    for phase in forecast["phases"]:
        got = actual.get(phase["phase"], {})
        rate = got.get("rows_per_s")
        hours = got["steps"] * phase["global_batch_size"] / rate / 3600 if rate else None
        expected = phase["rows_per_s_per_gpu"]
        expected = expected * forecast["gpus"] if expected else None
        lines.append(f"| {phase['phase']} | {got.get('steps', 0)} of {phase['steps']} | "
                     f"{_cell(expected, 1)} | {_cell(rate, 1)} | {_cell(phase['hours'], 4)} | "
                     f"{_cell(hours, 4)} |")
    return lines


def _cell(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"
