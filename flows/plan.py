"""`bert-dag --plan`: the forecast of a whole run (training/forecast.py) before its launch, with
the data stages' sizes: read from a stage's manifest where the run folder holds it built with
these settings, else estimated from the sizes of the input files.

No stage runs: no Prefect server, no Beam, no DeepSpeed, no rank. The stages are the folders
the flow would use, found by their keys as the flow computes them, from the flow's own list of
stages (`dag.look_up_data_stages`, flows/dag.py): a built one is exactly what the run would
reuse; inputs edited since, or other settings, mean a new folder and an estimate. Input
bytes: local files, globs and folders as the jobs expand them; a remote (gs://) input is
"unknown size" unless `--input_bytes` gives the corpus's text bytes. Text per input byte:
`TEXT_PER_BZ2_BYTE` for a .bz2 Wikipedia dump, 1 otherwise (JSONL keys and XML markup count as
text: an overestimate). Each source's text counts `weight` times.

The flow writes `forecast.json` into its pre-training stage's folder when the stage starts,
and the report sets it beside the run's own figures (flows/stage_forecast.py).
"""
from __future__ import annotations

import argparse
import dataclasses

from common import storage
from flows import dag, steps
from flows.config import DagConfig
from flows.stage_forecast import launch_gpus
from training import forecast as fc
from training.forecast import PhaseData


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


def corpus_stage(stages: dag.DataStages, vocab: tuple[int, str], text: float | None
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


def phase_data(cfg: DagConfig, stages: dag.DataStages, text: float | None
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


def vocab_size(cfg: DagConfig, stages: dag.DataStages) -> tuple[int, str]:
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
    stages = dag.look_up_data_stages(cfg)
    vocab = vocab_size(cfg, stages)
    text, input_rows = input_text_bytes(cfg, args.input_bytes)
    text, corpus_rows = corpus_stage(stages, vocab, text)
    data, shard_rows = phase_data(cfg, stages, text)
    config = dataclasses.replace(cfg.pretrain, output_dir=cfg.output)
    # each decay costs what its steps cost at the last phase's batch and length; its data is
    # the last phase's shards, or (other sources) not estimated here
    config = dataclasses.replace(config, phases=(*config.phases, *(dataclasses.replace(
        steps.decay_phase(cfg, d), name=f"decay {d.name}") for d in cfg.decays)))
    data = [*data, *(None if d.sources else data[-1] for d in cfg.decays)]
    shape = fc.run_shape(config, vocab[0])
    return fc.run_plan(shape, data, args, launch_gpus(cfg),
                       stages=[*input_rows, *corpus_rows, *shard_rows])
