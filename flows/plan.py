"""`bert-dag --plan`: the forecast of a whole run (training/forecast.py) before its launch, with
the data stages' sizes: read from a stage's manifest where the run folder holds it built with
these settings, else estimated from the sizes of the input files.

No stage runs: no Prefect server, no Beam, no DeepSpeed, no rank. The stages are the folders
the flow would use, found by their keys as the flow computes them (`steps.look_up_data_stages`):
a built one is exactly what the run would reuse; inputs edited since, or other settings, mean
a new folder and an estimate. Input bytes: local files, globs and folders as the jobs expand
them; a remote (gs://) input is "unknown size" unless `--input_bytes` gives the corpus's text
bytes. Text per input byte: `TEXT_PER_BZ2_BYTE` for a .bz2 Wikipedia dump, 1 otherwise (JSONL
keys and XML markup count as text: an overestimate). Each source's text counts `weight` times.

The flow writes `forecast.json` into its pre-training stage's folder when the stage starts
(`write_stage_forecast`: this machine's profile, no calibration), and the report sets it
beside the run's own figures from `metrics.jsonl` (`forecast_vs_actual`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os

from common import storage
from flows import steps
from flows.config import DagConfig
from training import forecast as fc
from training.forecast import PhaseData

logger = logging.getLogger("flows")


def input_text_bytes(cfg: DagConfig, given: float | None) -> tuple[float | None, list[dict]]:
    """The corpus's text bytes (`given` wins) and a row per source: its input bytes."""
    total, rows = 0.0, []
    for source in cfg.data.all_sources():
        if storage.is_remote(source.path):
            rows.append({"stage": f"input {source.name}", "size": "unknown size",
                         "source": f"{source.path} (remote; --input_bytes gives the text bytes)"})
            total = None
            continue
        files = storage.expand_input_files(source.path)
        size = sum(f.size_bytes for f in files)
        text = sum(f.size_bytes * (fc.TEXT_PER_BZ2_BYTE if f.path.endswith(".bz2") else 1.0)
                   for f in files) * source.weight
        rows.append({"stage": f"input {source.name}", "size": f"{fc.human_bytes(size)} in "
                     f"{len(files)} file(s)", "source": source.path})
        total = None if total is None else total + text
    return (given if given is not None else total), rows


def corpus_stage(stages: steps.DataStages, vocab: tuple[int, str], text: float | None
                 ) -> tuple[float | None, list[dict]]:
    """The corpus's text bytes (built: its ledger's bytes out) and its rows: corpus, vocab."""
    corpus = stages.corpus
    ledger = corpus.manifest.get("ledger", {})
    if corpus.cached and ledger:
        text = float(sum(row.get("bytes_out", 0) for row in ledger.values()))
        words = sum(row.get("words_out", 0) for row in ledger.values())
        rows = [{"stage": corpus.stage, "size": f"{fc.human_bytes(text)} text, {words:,} words",
                 "source": f"manifest {corpus.path}"}]
    else:
        words = None if text is None else round(text / fc.BYTES_PER_WORD)
        rows = [{"stage": corpus.stage, "size": f"{fc.human_bytes(text)} text, "
                 f"{'unknown' if words is None else f'{words:,}'} words",
                 "source": f"estimate: inputs' text / {fc.BYTES_PER_WORD} B per word"}]
    rows.append({"stage": "vocab", "size": f"{vocab[0]:,} tokens", "source": vocab[1]})
    return text, rows


def phase_data(cfg: DagConfig, stages: steps.DataStages, text: float | None
               ) -> tuple[list[PhaseData | None], list[dict]]:
    """Each phase's shards (train split): built, or estimated from the corpus's text bytes."""
    data, rows = [], []
    for phase, stage in zip((1, 2), stages.shards):
        shards = getattr(cfg.shards, f"phase{phase}")
        if stage.cached:
            item = fc.shards_data(stage.path)
        elif text is not None:
            item = fc.estimate_data(text, shards.max_seq_length, shards.dupe_factor,
                                    shards.pack, shards.validation_fraction)
        else:
            item = None
        data.append(item)
        size = "unknown" if item is None else (
            f"{item.instances:,} instances, {item.rows:,} rows, {item.tokens:,} tokens, "
            f"{fc.human_bytes(item.bytes)}")
        rows.append({"stage": stage.stage, "size": size,
                     "source": item.source if item else "unknown: the inputs' size is"})
    return data, rows


def launch_gpus(cfg: DagConfig) -> int:
    """The run's ranks: `launch.nproc_per_node` x the hostfile's nodes (1 without one)."""
    nodes = 1
    if cfg.launch.hostfile and os.path.exists(cfg.launch.hostfile):
        with open(cfg.launch.hostfile, encoding="utf-8") as f:
            nodes = max(1, sum(1 for line in f if line.strip() and not line.startswith("#")))
    return cfg.launch.nproc_per_node * nodes


def vocab_size(cfg: DagConfig, stages: steps.DataStages) -> tuple[int, str]:
    """The vocabulary's size and where it is read: the built stage's manifest, else the
    checkpoint continued from (its vocabulary is kept), else the vocab.vocab_size setting (a
    BPE one padded to a multiple of 64 with unused tokens, as train_vocab writes it)."""
    size = stages.vocab.manifest.get("vocab_size") if stages.vocab.cached else None
    if size:
        return int(size), f"manifest {stages.vocab.path}"
    init_from = cfg.pretrain.model.init_from
    if init_from and not storage.is_remote(init_from):
        from model.hf import find_starting_point

        size = find_starting_point(init_from).config.vocab_size  # its embedding rows
        return size, f"the checkpoint's vocabulary ({init_from})"
    if cfg.vocab.kind == "bpe":
        from pipelines.vocab.bpe import padded_size

        return (padded_size(cfg.vocab.vocab_size),
                "the vocab.vocab_size setting, padded to a multiple of 64 (BPE)")
    return cfg.vocab.vocab_size, "the vocab.vocab_size setting"


def dag_plan(cfg: DagConfig, args: argparse.Namespace) -> int:
    """`bert-dag --plan`: print the forecast of `cfg` (see the module docstring)."""
    stages = steps.look_up_data_stages(cfg)
    vocab = vocab_size(cfg, stages)
    text, input_rows = input_text_bytes(cfg, args.input_bytes)
    text, corpus_rows = corpus_stage(stages, vocab, text)
    data, shard_rows = phase_data(cfg, stages, text)
    config = dataclasses.replace(cfg.pretrain, output_dir=cfg.output)
    # each decay costs what its steps cost at the last phase's batch and length; its data is
    # the last phase's shards, or (other sources) not estimated here
    last = config.phases[-1]
    config = dataclasses.replace(config, phases=(*config.phases, *(dataclasses.replace(
        last, name=f"decay {d.name}", steps=d.steps, warmup_steps=0, decay_steps=d.steps,
        batch_warmup_rows=0, batch_warmup_tokens=0) for d in cfg.decays)))
    data = [*data, *(None if d.sources else data[-1] for d in cfg.decays)]
    shape = fc.run_shape(config, vocab[0])
    return fc.run_plan(shape, data, args, launch_gpus(cfg),
                       stages=[*input_rows, *corpus_rows, *shard_rows])


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
