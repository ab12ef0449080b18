"""The `pretrain-bert` flow: the whole BERT DAG, each task one library call.

    extract Wikipedia ┐
    extract books ────┼> build corpus -> train vocab -> shards 128 ┐
    extract documents ┘  (mixture)                 └-> shards 512 ┴> pretrain (phase 1 -> 2)
      (one per source of data.sources: your own text)
                       (pretrain.model.init_from: the checkpoint's vocabulary, not train vocab)
        -> export Hugging Face folder -> fine-tune (tasks x learning rates x seeds) -> best
        -> decays (WSD: a kept checkpoint of the stable run, annealed on its shards or on
           other sources, each its own stage; probed at its two ends) -> report
      probes (submitted before pretrain: fine-tune slices of pretrain's exports as they
      appear, flows/probes.py) ----------------------------------------------> report

The data stages, up to the shards, are flows/dag.py's `DATA_STAGES`, each a task here: the list
`bert-dag --plan` looks up. Every stage writes to a content-addressed folder (flows/stages.py),
so a re-run skips what is done and resumes at the stage that failed; pre-training resumes from
its last checkpoint.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from prefect import Task, flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait

from flows import dag, decay_report, finetune_runs, probes, steps
from flows import report as reporting
from flows.config import DagConfig, check_inputs_exist, resolve
from flows.stages import StageResult

# Stage outputs are content-addressed on disk; Prefect's own result caching stays off.
IO_TASK = {"retries": 2, "retry_delay_seconds": 5, "cache_policy": NO_CACHE}
COMPUTE_TASK = {"cache_policy": NO_CACHE}


@functools.cache
def stage_task(stage: dag.Stage) -> Task:
    """A data stage's task: its library call under its name (flows/dag.py `DATA_STAGES`)."""
    return task(stage.run, name=stage.name, **(IO_TASK if stage.retries else COMPUTE_TASK))


def run_data_stages(cfg: DagConfig) -> dag.Made:
    """The data stages of `DATA_STAGES`, each a task (`bert-dag --plan` looks up the same
    list)."""
    return dag.walk(cfg, dag.DATA_STAGES, lambda stage, args: stage_task(stage).submit(*args))


@task(name="pretrain", **COMPUTE_TASK)
def pretrain(cfg: DagConfig, vocab: StageResult, shards: list[StageResult]) -> StageResult:
    return steps.pretrain(cfg, vocab, shards, log=get_run_logger().info)


@task(name="probes", **COMPUTE_TASK)
def watch_probes(cfg: DagConfig, run_dir: str) -> dict:
    return probes.watch(cfg, run_dir, log=get_run_logger().info)


@task(name="decay", **COMPUTE_TASK)
def decay(cfg: DagConfig, name: str, run: StageResult, vocab: StageResult,
          shards: StageResult) -> list[StageResult]:
    """One decay of `decays`: its data stages (if it has sources), the stable checkpoint's
    export, and its training run; where the run probes, the probes of its two ends."""
    spec = next(d for d in cfg.decays if d.name == name)
    data, decay_shards = steps.decay_shards(cfg, spec, vocab, shards)
    start = steps.stable_checkpoint(cfg, run, spec)
    trained = steps.train_decay(cfg, spec, start, vocab, decay_shards, log=get_run_logger().info)
    if probes.enabled(cfg):  # the report sets them beside the stable run's probes
        probes.probe_decay(cfg, decay_report.probe_exports(start, trained),
                           log=get_run_logger().info)
    return [*data, start, trained]


@task(name="export-hf", **IO_TASK)
def export_hf(cfg: DagConfig, run: StageResult) -> StageResult:
    return steps.export_hf(cfg, run)


@task(name="finetune", **COMPUTE_TASK)
def finetune_run(cfg: DagConfig, model: StageResult, job: finetune_runs.FinetuneJob) -> dict:
    return finetune_runs.finetune_run(cfg, model, job)


@task(name="finetune-best", **COMPUTE_TASK)
def finetune_best(cfg: DagConfig, model: StageResult, outcomes: list[dict],
                  out: str | None = None) -> dict:
    return finetune_runs.finetune_best(cfg, model, outcomes, out)


@task(name="report", **COMPUTE_TASK)
def report(cfg: DagConfig, stages: list[StageResult], finetune: dict | None,
           filename: str = "report.md", folder: str | None = None,
           invocation: reporting.Invocation | None = None) -> dict:
    result = reporting.report(cfg, stages, finetune, filename, folder, invocation)
    create_table_artifact(result["stages"], key="stage-timings",
                          description="Stage outputs, whether reused from a previous run, seconds")
    if result["finetune_table"]:
        create_markdown_artifact(result["finetune_table"], key="finetune-results",
                                 description="Fine-tuning dev scores (best learning rate per task)")
    if result["loss_curve"] and os.path.exists(result["loss_curve"]):
        create_markdown_artifact(reporting.image_markdown(result["loss_curve"]), key="loss-curve",
                                 description="Pre-training loss curve")
    create_markdown_artifact(result["markdown"], key="report", description="Run report")
    return result


@flow(name="pretrain-bert", log_prints=True)
def pretrain_bert(preset: str = "tiny", overrides: dict[str, Any] | None = None,
                  output: str | None = None, data_only: bool = False,
                  report_dir: str | None = None, settings_file: str = "") -> dict:
    """Data -> vocabulary -> shards -> pre-training -> export -> fine-tuning fan-out -> report.

    `output` (the run's root folder) is its own parameter so that a deployment can fix it (the
    cluster's volume) while each run passes its own `overrides`; an `output` key there wins.
    `data_only` stops after the shards: run on a CPU pool, it leaves the data stages for a
    later full run with the same settings and output, which reuses them instead of holding its
    GPUs while the Beam jobs work. `report_dir` takes the report and the fine-tuning summary
    instead of the root (a sweep's variants share the root's stages, not their reports).
    `settings_file` names the file `overrides` start from (bert-dag's `--config`): the report's
    next commands name it rather than spell out its settings."""
    if output:
        overrides = {"output": output, **(overrides or {})}
    cfg = resolve(preset, overrides, data_only=data_only)
    # the report's next commands repeat this run: its preset, settings file and overrides
    invocation = reporting.Invocation(preset, overrides or {}, settings_file)
    get_run_logger().info("run folder %s (preset %s)", cfg.output, cfg.name)
    get_run_logger().debug("resolved config:\n%s", steps.describe(cfg))  # BERT_LOG_LEVEL=DEBUG
    check_inputs_exist(cfg, data_only)
    if not data_only:
        probes.check(cfg)

    made = run_data_stages(cfg)
    data, vocab, shards = dag.stage_list(made), made["vocab"], made["shards"]
    if data_only:
        return report(cfg, data, None, "report-data.md", report_dir, invocation)
    # the probes fine-tune the run's intermediate exports while it trains (flows/probes.py)
    run_dir = steps.pretrain_dir(cfg, vocab, shards)
    watcher = None
    if probes.enabled(cfg):
        probes.pretraining_starts(run_dir)
        watcher = watch_probes.submit(cfg, run_dir)
    try:
        run = pretrain(cfg, vocab, shards)
    finally:
        probes.pretraining_ended(run_dir)
    model = export_hf(cfg, run)
    # decays anneal the stable run's kept checkpoints, each its own stage (WSD's decays)
    decayed = [stage for spec in cfg.decays
               for stage in decay(cfg, spec.name, run, vocab, shards[-1])]

    finetune = None
    jobs = finetune_runs.finetune_jobs(cfg)  # every family's tasks x learning rates x seeds
    if jobs:
        futures = finetune_run.map(unmapped(cfg), unmapped(model), jobs)
        wait(futures)
        # A failed fine-tuning run is reported as failed; the others still count.
        outcomes = [finetune_runs.outcome(job, f.state) for job, f in zip(jobs, futures)]
        out = os.path.join(report_dir, "finetune") if report_dir else None
        finetune = finetune_best(cfg, model, outcomes, out)
    if watcher is not None:
        watcher.wait()  # the report charts every probe; a failed watcher fails no stage
    return report(cfg, [*data, run, model, *decayed], finetune, folder=report_dir,
                  invocation=invocation)
