"""The library calls behind each flow task, kept free of Prefect so they test on their own.

Each stage function resolves its content-addressed output folder (flows/stages.py) and calls
one job with its typed config: a Beam job's `run(config, beam_args)` (its settings and paths
in one config, `pipelines.jobs.with_paths`), or the
DeepSpeed training entry point (as a subprocess, flows/launch.py, so the `deepspeed`/`torchrun`
launchers and multi-node runs work the same way). The fine-tuning runs are flows/finetune_runs.py,
the report flows/report.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

from common import storage
from flows.config import DagConfig, DecayConfig
from flows.launch import run_subprocess
from flows.stages import StageResult, is_looking_up, run_stage, stage_dir
from pipelines.documents.source import SourceConfig
from training import config as training
from training.config import PretrainConfig


def describe(cfg: DagConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, default=str)


# ---------------------------------------------------------------- data stages (Beam)

def extract_wikipedia(cfg: DagConfig) -> StageResult | None:
    from pipelines import extract_wikipedia as job
    from pipelines import jobs

    pattern = cfg.data.path_of("wikipedia")
    if not pattern:
        return None
    config = job.WikipediaConfig()
    key = {**extract_stage_config(pattern, inputs_fingerprint(pattern), job.OUTPUT_VERSION),
           **dataclasses.asdict(config)}
    return run_stage(cfg.output, "wikipedia", key, lambda out: job.run(
        jobs.with_paths(job.ExtractWikipediaConfig, config, input=pattern, output=out),
        cfg.data.beam_args))


def extract_books(cfg: DagConfig) -> StageResult | None:
    from pipelines import extract_books as job

    pattern = cfg.data.path_of("books")
    if not pattern:
        return None
    key = extract_stage_config(pattern, inputs_fingerprint(pattern), job.OUTPUT_VERSION)
    return run_stage(cfg.output, "books", key, lambda out: job.run(
        job.ExtractBooksConfig(input=pattern, output=out), cfg.data.beam_args))


def extract_documents(cfg: DagConfig, source: SourceConfig) -> StageResult:
    """One of the user's own sources (a generic kind) -> its documents folder, stage
    `documents-<name>`. Its weight is the corpus stage's (applied after deduplication), so a
    new weight reuses this folder."""
    from pipelines import extract_documents as job

    source = dataclasses.replace(source, weight=1.0)
    key = {**extract_stage_config(source.path, inputs_fingerprint(source.path),
                                  job.OUTPUT_VERSION), "source": dataclasses.asdict(source)}
    return run_stage(cfg.output, f"documents-{source.name}", key, lambda out: job.run(
        job.ExtractDocumentsConfig(sources=(source,), output=out), cfg.data.beam_args))


def extract_stage_config(pattern: str, fingerprint: str, output_version: int) -> dict[str, Any]:
    """What an extraction stage's folder is keyed on: the inputs and the job's output version."""
    return {"input": pattern, "input_sha": fingerprint, "output_version": output_version}


def build_corpus(cfg: DagConfig, sources: list[StageResult]) -> StageResult:
    from pipelines import build_corpus as job

    if not sources:
        raise ValueError("no data sources: set data.wikipedia, data.books and/or data.sources")
    inputs = ",".join(s.path for s in sources)
    mixture = cfg.data.all_sources()
    key = {"mixture": [{"name": s.name, "weight": s.weight, "licence": s.licence}
                       for s in mixture]}
    if any(s.quality for s in mixture):  # absent when unset: unfiltered runs keep their folders
        key["quality"] = {s.name: dataclasses.asdict(s.quality) for s in mixture if s.quality}
    if cfg.data.near_duplicates is not None:
        key["near_duplicates"] = dataclasses.asdict(cfg.data.near_duplicates)
    return run_stage(cfg.output, "corpus", key, lambda out: job.run(
        job.BuildCorpusConfig(input=inputs, output=out, sources=mixture,
                              near_duplicates=cfg.data.near_duplicates), cfg.data.beam_args),
        upstream=tuple(sources))


def audited_tasks(cfg: DagConfig) -> tuple[str, ...]:
    """The tasks of `finetune.tasks` whose evaluation files are there (a task without them
    fails its own fine-tuning run; the audit, which serves every task, leaves it out)."""
    return tuple(entry.task for entry in _audited_entries(cfg))


def _audited_entries(cfg: DagConfig) -> list:
    found = []
    for entry in cfg.finetune.task_entries():
        try:
            entry.family.check_files(entry.task, os.path.join(cfg.finetune.data,
                                                              entry.data_folder))
        except (OSError, ValueError):
            continue
        found.append(entry)
    return found


def audit_contamination(cfg: DagConfig, corpus: StageResult) -> StageResult:
    """The corpus's overlap with the evaluation sets of `finetune.tasks` (13-gram), each read
    by its task's family (finetune/eval_sets.py) and handed to the Beam job."""
    from flows import audit_contamination as audit
    from pipelines.audit_contamination import AuditConfig

    entries = _audited_entries(cfg)
    tasks = tuple(e.task for e in entries)
    own = [e.family.task(e.task) for e in entries if e.family.name == "user"]
    key = {"eval_data": cfg.finetune.data, "tasks": tasks,
           "eval_sha": inputs_fingerprint(cfg.finetune.data)}
    if own:  # absent without a task file: the built-in tasks' audits keep their folders
        files = [path for t in own for path in (t.dev, t.test) if path is not None]
        key |= {"task_file_tasks": [dataclasses.asdict(t) for t in own],
                "task_file_sha": storage.config_hash(
                    [(f, os.path.getsize(f), int(os.path.getmtime(f))) for f in files])}
    return run_stage(cfg.output, "audit", key, lambda out: audit.audit(
        AuditConfig(input=corpus.path, output=out, eval_data=cfg.finetune.data), entries,
        cfg.data.beam_args, cfg.finetune.skip_bad_rows), upstream=(corpus,))


def decontaminate(cfg: DagConfig, corpus: StageResult, audit: StageResult) -> StageResult:
    """The corpus without the passages `audit` found in an evaluation set."""
    from pipelines import decontaminate as job

    return run_stage(cfg.output, "corpus-clean", {}, lambda out: job.run(
        job.DecontaminateConfig(input=corpus.path, output=out, audit=audit.path),
        cfg.data.beam_args), upstream=(corpus, audit))


def train_vocab(cfg: DagConfig, corpus: StageResult) -> StageResult:
    from pipelines import jobs
    from pipelines import train_vocab as job

    key = dataclasses.asdict(cfg.vocab)
    if key["kind"] == "wordpiece":  # absent for WordPiece: its folders keep their keys
        del key["kind"]
    return run_stage(cfg.output, "vocab", key, lambda out: job.run(
        jobs.with_paths(job.TrainVocabConfig, cfg.vocab, input=corpus.path, output=out,
                        progress=False), cfg.data.beam_args), upstream=(corpus,))


def make_shards(cfg: DagConfig, corpus: StageResult, vocab: StageResult, phase: int) -> StageResult:
    """Phase `phase`'s shards (`shards.phase<N>`); casing follows the vocabulary folder."""
    from pipelines import jobs
    from pipelines import make_shards as job

    config = getattr(cfg.shards, f"phase{phase}")
    return run_stage(cfg.output, f"shards{config.max_seq_length}", dataclasses.asdict(config),
                     lambda out: job.run(jobs.with_paths(
                         job.MakeShardsConfig, config, input=corpus.path, vocab=vocab.path,
                         output=out), cfg.data.beam_args), upstream=(corpus, vocab))


def inputs_fingerprint(pattern: str) -> str:
    """Names, sizes and mtimes of the input files: a changed input gives a new stage folder.
    A remote input is not listed while looking up (`bert-dag --plan` makes no cloud calls): its
    stage is then not found, and the plan estimates it."""
    if storage.is_remote(pattern) and is_looking_up():
        return "not listed"
    try:
        files = storage.expand_inputs(pattern)
    except FileNotFoundError:
        return "missing"
    if any(storage.is_remote(f) for f in files):
        return storage.config_hash(files)  # remote: names only (stat is a round trip each)
    return storage.config_hash([(f, os.path.getsize(f), int(os.path.getmtime(f))) for f in files])


# ---------------------------------------------------------------- pre-training (DeepSpeed)

def pretrain_config(cfg: DagConfig, vocab: StageResult, shards: list[StageResult],
                    output_dir: str) -> PretrainConfig:
    """The training run's config: the `pretrain` settings with the stages' folders filled in
    (phase N trains on shards N)."""
    phases = tuple(dataclasses.replace(phase, train_shards=stage.path)
                   for phase, stage in zip(cfg.pretrain.phases, shards))
    data = dataclasses.replace(cfg.pretrain.data, vocab_dir=vocab.path)
    return dataclasses.replace(cfg.pretrain, data=data, output_dir=output_dir, phases=phases)


def launch_command(cfg: DagConfig, config_file: str) -> list[str]:
    """The command that starts training (`training.launch.launch_command`: one process,
    `torchrun`, or `deepspeed`, multi-node with a hostfile). The config file holds the whole
    run's config; `launch.extra_args` are the entry point's other flags."""
    from training.launch import launch_command as command

    launch = cfg.launch
    return command(launch.launcher, ["--config", config_file, *launch.extra_args],
                   launch.nproc_per_node, launch.hostfile)


def pretrain(cfg: DagConfig, vocab: StageResult, shards: list[StageResult],
             log: Callable[[str], None] = print) -> StageResult:
    """Run both phases; a re-run after a failure resumes from the last checkpoint."""
    def forecast(config: PretrainConfig, out: str) -> None:
        from flows.stage_forecast import write_stage_forecast
        write_stage_forecast(cfg, config, out)  # the report sets it beside the actual figures

    return _train(cfg, "pretrain", pretrain_key(cfg),
                  lambda out: pretrain_config(cfg, vocab, shards, out), (vocab, *shards), log,
                  forecast)


def _train(cfg: DagConfig, stage: str, key: dict[str, Any],
           make_config: Callable[[str], PretrainConfig], upstream: tuple[StageResult, ...],
           log: Callable[[str], None], before: Callable[[PretrainConfig, str], None] | None = None
           ) -> StageResult:
    """A training stage: `make_config(folder)`'s run, launched as `launch.*` says; a re-run
    after a failure resumes from its last checkpoint."""
    def build(out: str) -> None:
        config_file = storage.join(out, "launch_config.json")
        config = make_config(out)
        training.save(config, config_file)
        if before is not None:
            before(config, out)
        # a GPU preset where torch has no CUDA: one line now, not N ranks training on the CPU
        from training.launch import refuse_cpu_fallback
        refuse_cpu_fallback(config.engine.device)
        started = time.monotonic()
        run_subprocess(launch_command(cfg, config_file), log=log)
        metrics = _last_metrics(out)
        storage.write_manifest(out, {"stage": stage, "config": key,
                                     "seconds": time.monotonic() - started,
                                     "hf_dir": storage.join(out, "hf"), "final_metrics": metrics})

    return run_stage(cfg.output, stage, key, build, upstream=upstream)


# ---------------------------------------------------------------- decays (WSD's anneals)

def decay_shards(cfg: DagConfig, decay: DecayConfig, vocab: StageResult,
                 shards: StageResult) -> tuple[list[StageResult], StageResult]:
    """(its own data stages, the shards) a decay trains on: the run's last shards, or its
    `sources` through the same stages as the run's corpus (reused where their keys match),
    tokenized with the run's vocabulary and shard settings."""
    if not decay.sources:
        return [], shards
    own = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, wikipedia="", books="", sources=decay.sources))
    documents = [extract_documents(own, source) for source in decay.sources]
    corpus = build_corpus(own, documents)
    shards = make_shards(own, corpus, vocab, len(cfg.pretrain.phases))
    return [*documents, corpus, shards], shards


def stable_checkpoint(cfg: DagConfig, run: StageResult, decay: DecayConfig) -> StageResult:
    """The stable run's kept checkpoint at `decay.from_step`, exported (verified first) as the
    decay's starting point; keyed by the checkpoint's tag, so two decays from it share it."""
    from training.export_checkpoint import check_stable, export_kept, kept_tag

    tag = kept_tag(run.path, decay.from_step)
    check_stable(run.path, tag)

    def build(out: str) -> None:
        export_kept(run.path, tag, out)
        storage.write_manifest(out, {"stage": "stable", "run": run.path, "tag": tag})

    return run_stage(cfg.output, "stable", {"tag": tag}, build, upstream=(run,))


def decay_phase(cfg: DagConfig, decay: DecayConfig) -> training.PhaseConfig:
    """The decay's one phase (its shards aside), as it trains and as `bert-dag --plan`
    forecasts it: `decay.steps` at the stable run's last phase's peak and batch, the learning
    rate falling to 0 over all of them (WSD, no warmup)."""
    return dataclasses.replace(cfg.pretrain.phases[-1], name=decay.name, steps=decay.steps,
                               warmup_steps=0, decay_steps=decay.steps, batch_warmup_rows=0,
                               batch_warmup_tokens=0)


def decay_config(cfg: DagConfig, decay: DecayConfig, start: StageResult, vocab: StageResult,
                 shards: StageResult, output_dir: str) -> PretrainConfig:
    """The decay's run: the stable run's settings from the exported checkpoint
    (`model.init_from`), one phase of `decay.steps` at the last phase's peak and batch, its
    learning rate falling to 0 over all of them (WSD, no warmup), no probes."""
    phase = dataclasses.replace(decay_phase(cfg, decay), train_shards=shards.path,
                                validation_shards="")
    return dataclasses.replace(
        cfg.pretrain, output_dir=output_dir, phases=(phase,),
        model=dataclasses.replace(cfg.pretrain.model, preset="", arch="", init_from=start.path,
                                  **{f: 0 for f in training.SHAPE_FIELDS}),
        data=dataclasses.replace(cfg.pretrain.data, vocab_dir=vocab.path),
        cadence=dataclasses.replace(cfg.pretrain.cadence, probe_every=0))


def train_decay(cfg: DagConfig, decay: DecayConfig, start: StageResult, vocab: StageResult,
                shards: StageResult, log: Callable[[str], None] = print) -> StageResult:
    """Train the decay (`decay_config`) as a stage keyed by its settings, its checkpoint and its
    shards."""
    key = {"decay": training.to_dict(decay_config(cfg, decay, start, vocab, shards, ""))}
    return _train(cfg, "decay", key,
                  lambda out: decay_config(cfg, decay, start, vocab, shards, out),
                  (start, vocab, shards), log)


def pretrain_key(cfg: DagConfig) -> dict[str, Any]:
    """What the pretrain stage's folder is keyed on. `cadence.probe_every` and
    `cadence.report_to` are left out: probe exports and trackers do not change the weights, so
    turning them on or off keeps a run's folder (and a finished run)."""
    settings = training.to_dict(cfg.pretrain)
    settings["cadence"] = {k: v for k, v in settings["cadence"].items()
                           if k not in ("probe_every", "report_to")}
    # a renamed field is keyed under the name its folders were made with: a rename re-runs nothing
    for old, new in training.RENAMED_FIELDS.items():
        (section, _, name), (_, _, new_name) = old.partition("."), new.partition(".")
        settings[section][name] = settings[section].pop(new_name)
    return {"pretrain": settings, "launch": dataclasses.asdict(cfg.launch)}


def pretrain_dir(cfg: DagConfig, vocab: StageResult, shards: list[StageResult]) -> str:
    """The pretrain stage's folder, known before it is built (run_stage builds in place): where
    the probes' watcher looks for the exports."""
    return stage_dir(cfg.output, "pretrain", pretrain_key(cfg), (vocab, *shards))[0]


def _last_metrics(out: str) -> dict:
    """The last metrics.jsonl record of each split ({} before the first)."""
    from training.metrics import read_metrics

    if not os.path.exists(os.path.join(out, "metrics.jsonl")):
        return {}
    return {record.get("split", "train"): record for record in read_metrics(out)}


def export_hf(cfg: DagConfig, run: StageResult) -> StageResult:
    """The pre-training run's consolidated fp32 Hugging Face folder, checked by loading it."""
    hf_dir = run.manifest.get("hf_dir") or storage.join(run.path, "hf")

    def build(out: str) -> None:
        import transformers

        # the class the export names (BertForPreTraining, ModernBertForMaskedLM, ...)
        architecture = transformers.AutoConfig.from_pretrained(hf_dir).architectures[0]
        model = getattr(transformers, architecture).from_pretrained(hf_dir)
        transformers.AutoTokenizer.from_pretrained(hf_dir)
        storage.write_manifest(out, {"stage": "export", "hf_dir": hf_dir,
                                     "parameters": sum(p.numel() for p in model.parameters())})

    result = run_stage(cfg.output, "export", {}, build, upstream=(run,))
    return dataclasses.replace(result, path=hf_dir)
