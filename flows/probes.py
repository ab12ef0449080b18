"""Probes: quality while it trains. Cheap fine-tuning slices score pre-training's exports.

With `pretrain.cadence.probe_every` N the trainer writes an export every N global steps
(training/probes.py: `<pretrain run>/probes/step-NNNNNNN/hf` + `manifest.json`, renamed into
place complete). The flow submits `watch` before the pretrain task: it looks at that folder
every few seconds, fine-tunes each task of `finetune.probe` (finetune/config.py `ProbeConfig`:
slices, one learning rate, one seed) on each new export, one process at a time
(`python -m flows.probes SPEC`, on `finetune.probe.device`, the CPU by default), never holding
pre-training up, and after pre-training ends it probes what is left and returns.

Results are addressed by content: `<root>/probes/<task>-<key>/results.json`, the key a hash of
the export's weights (the sha256 in its manifest), the task's data folder and the loop's whole
config. A re-run reuses every finished result; `results.json` is written atomically and only it
marks a probe done, so a probe process killed (kill -9) mid-run loses nothing finished and
leaves nothing taken for a result: the next run probes that one again. A probe process dies
with the flow's process (Linux's parent-death signal), and holds its result folder's build lock
(flows/stages.py): two flows on one root run each probe once, the second reusing the first's
result. A failed probe is logged and left out; pre-training and the other probes go on. Once every task has a result for an export,
its weights are deleted (`finetune.probe.keep_exports`), its manifest kept: results are found
by the manifest's sha256, so a re-run still reuses them.

Each decay (`decays`) is probed at its two ends once it has trained (`probe_decay`): the stable
checkpoint it starts from (whose result the stable run's probe at that step already holds, the
weights being the same) and its last step; the report draws each decay's scores beside the
stable run's (flows/decay_report.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import storage
from flows import stages
from flows.config import DagConfig
from flows.steps import inputs_fingerprint
from training.probes import PROBES, WEIGHTS

logger = logging.getLogger("flows")

POLL_SECONDS = 5.0
"""How often the watcher looks for new exports while pre-training runs."""
LOCK_POLL_SECONDS = 1.0
"""How often a watcher tries a probe's build lock while another flow's watcher runs it."""
RESULTS = "results.json"


@dataclass(frozen=True)
class ProbeExport:
    """One finished export of the pre-training run (its `probes/step-NNNNNNN` folder)."""
    global_step: int
    hf_dir: str
    weights_sha256: str


@dataclass(frozen=True)
class ProbeJob:
    """One task on one export, and the folder its result goes to."""
    task: str
    export: ProbeExport
    out: str
    spec: dict

    @property
    def results(self) -> str:
        return os.path.join(self.out, RESULTS)

    @property
    def name(self) -> str:
        return f"{self.task} @ step {self.export.global_step}"


def enabled(cfg: DagConfig) -> bool:
    """Whether the run probes: exports due, probe tasks named and fine-tuning data given."""
    return bool(cfg.pretrain.cadence.probe_every and cfg.finetune.probe.tasks and cfg.finetune.data)


def check(cfg: DagConfig) -> None:
    """The probe tasks are known and their data folders are there (before the data stages)."""
    if not enabled(cfg):
        return
    if storage.is_remote(cfg.output):
        raise ValueError(f"setting pretrain.cadence.probe_every: the probes read the exports "
                         f"from a local or mounted run folder, not {cfg.output} (set it to 0, "
                         "or run with a local --output)")
    for entry in task_entries(cfg):
        folder = os.path.join(cfg.finetune.data, entry.data_folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"setting finetune.probe.tasks: {entry.task} reads "
                                    f"{folder}, which is not a folder")


def task_entries(cfg: DagConfig) -> list:
    from finetune.tasks import parse_tasks
    from finetune.user import use_task_file

    use_task_file(cfg.finetune.tasks_file)
    try:
        return parse_tasks(",".join(cfg.finetune.probe.tasks))
    except ValueError as e:
        raise ValueError(f"setting finetune.probe.tasks={','.join(cfg.finetune.probe.tasks)}: "
                         f"{str(e).removeprefix('--tasks: ')}") from None


def find_exports(run_dir: str) -> list[ProbeExport]:
    """The run's complete exports (a `step-*` folder with its manifest), by step."""
    folder = os.path.join(run_dir, PROBES)
    if not os.path.isdir(folder):
        return []
    exports = []
    for name in sorted(os.listdir(folder)):
        manifest = storage.read_manifest(os.path.join(folder, name))
        if name.startswith("step-") and manifest is not None:
            exports.append(ProbeExport(manifest["global_step"], os.path.join(folder, name, "hf"),
                                       manifest["weights_sha256"]))
    return exports


def loop_config(cfg: DagConfig, entry) -> dict:
    """The fine-tuning loop's config of one probe task: the flow's `finetune` settings for the
    task with the probe's slice, rate, seed and device (JSON-able, for the probe process)."""
    probe = cfg.finetune.probe
    ft = cfg.finetune.for_task(
        entry, max_train_examples=probe.max_train_examples,
        max_eval_examples=probe.max_eval_examples, epochs=probe.epochs,
        learning_rates=(probe.learning_rate,), seeds=(probe.seed,), batch_size=probe.batch_size,
        max_seq_length=probe.max_seq_length, device=probe.device, progress=False)
    return dataclasses.asdict(ft)


def probe_jobs(cfg: DagConfig, run_dir: str,
               exports: list[ProbeExport] | None = None) -> list[ProbeJob]:
    """Every probe task on every finished export of `run_dir` (or on `exports`), each with its
    result folder. A task's loop config and data fingerprint are made once for all exports (the
    watcher calls this every few seconds)."""
    tasks = []
    for entry in task_entries(cfg):
        ft, data = loop_config(cfg, entry), os.path.join(cfg.finetune.data, entry.data_folder)
        tasks.append((entry.task, ft, data, {
            "task": entry.task, "data": data,
            "data_files": inputs_fingerprint(data),  # data edited in place: probed again
            "loop": {k: v for k, v in ft.items() if k not in ("device", "progress", "report_to")}}))
    jobs = []
    for export in find_exports(run_dir) if exports is None else exports:
        for task, ft, data, identity in tasks:
            key = storage.config_hash({"weights_sha256": export.weights_sha256, **identity})
            out = storage.join(cfg.output, PROBES, f"{task}-{key}")
            spec = {"task": task, "hf_dir": export.hf_dir, "data": data, "loop": ft,
                    "global_step": export.global_step, "weights_sha256": export.weights_sha256,
                    "tasks_file": cfg.finetune.tasks_file, "out": out,
                    "num_threads": cfg.finetune.probe.num_threads,
                    "timeout_s": cfg.finetune.probe.timeout_minutes * 60}
            jobs.append(ProbeJob(task, export, out, spec))
    return jobs


def probe_command(job: ProbeJob) -> list[str]:
    """The probe process's command: this interpreter, this module, the job as JSON, and this
    process's id, so that the probe dies with it (`main`)."""
    return [sys.executable, "-m", "flows.probes", "--parent", str(os.getpid()),
            json.dumps(job.spec)]


def run_probe(job: ProbeJob, log: Callable[[str], None] = logger.info) -> str:
    """"reused" (its results.json is there), "ran" or "failed" (logged, never raised).

    The probe's result folder is built under its build lock (flows/stages.py `building`), which
    the probe process inherits: a second flow on the same root waits for the probe, then reuses
    its result (or runs it, if it failed or its flow was killed)."""
    if os.path.exists(job.results):
        return "reused"
    if not os.path.isdir(job.export.hf_dir):
        logger.warning("probe %s not run: the export's weights were deleted after its probes "
                       "(finetune.probe.keep_exports=false)", job.name)
        return "failed"
    storage.makedirs(job.out)
    with stages.building(job.out, f"probe {job.name}", LOCK_POLL_SECONDS):
        if os.path.exists(job.results):  # run by another flow while this one waited
            return "reused"
        return run_probe_process(job, log)


def run_probe_process(job: ProbeJob, log: Callable[[str], None]) -> str:
    threads = str(job.spec["num_threads"])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    started = time.monotonic()
    try:
        done = subprocess.run(probe_command(job), env=env, capture_output=True, text=True,
                              check=False, timeout=job.spec["timeout_s"],
                              pass_fds=stages.held_lock_fds())
    except subprocess.TimeoutExpired:  # run kills the process: a stuck probe ends the watch
        logger.warning("probe %s failed: no result after %.0f s (finetune.probe."
                       "timeout_minutes)", job.name, job.spec["timeout_s"])
        return "failed"
    if done.returncode != 0 or not os.path.exists(job.results):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        logger.warning("probe %s failed (exit %s): %s", job.name, done.returncode,
                       " / ".join(tail) or "no output")
        return "failed"
    log(f"probe {job.name}: score {read_result(job)['score']:.4f} "
        f"({time.monotonic() - started:.0f} s)")
    return "ran"


def read_result(job: ProbeJob) -> dict:
    """The probe's record; `finished_ms` (when it finished, the trackers' timestamp of its
    score) from the file's time where an older record lacks it."""
    with open(job.results, encoding="utf-8") as f:
        record = json.load(f)
    record.setdefault("finished_ms", int(os.path.getmtime(job.results) * 1000))
    return record


def run_probes(cfg: DagConfig, run_dir: str, skip: set[str] | None = None,
               log: Callable[[str], None] = logger.info) -> dict[str, list[str]]:
    """One pass: every job of `run_dir`'s exports not in `skip` (result folders), one process
    at a time. Returns the job names by outcome (ran, reused, failed); adds the folders to
    `skip`."""
    outcomes: dict[str, list[str]] = {"ran": [], "reused": [], "failed": []}
    skip = set() if skip is None else skip
    jobs = probe_jobs(cfg, run_dir)
    for job in jobs:
        if job.out in skip:
            continue
        outcomes[run_probe(job, log)].append(job.name)
        skip.add(job.out)
    if not cfg.finetune.probe.keep_exports:  # a failed probe keeps its export for a re-run
        for export in {job.export for job in jobs}:
            if all(os.path.exists(j.results) for j in jobs if j.export == export):
                prune_export(export)
    return outcomes


def prune_export(export: ProbeExport) -> None:
    """Delete an export's weights, keeping its manifest (the step and the weights' sha256 that
    address its results)."""
    if not os.path.isdir(export.hf_dir):
        return
    try:
        shutil.rmtree(export.hf_dir)
    except OSError as error:  # the probes are done either way: the watcher goes on
        logger.warning("probe export of step %d not deleted after its probes: %s",
                       export.global_step, error)
        return
    logger.debug("probe export of step %d deleted after its probes", export.global_step)


_ENDED: dict[str, threading.Event] = {}
_ENDED_LOCK = threading.Lock()


def _ended_event(run_dir: str) -> threading.Event:
    with _ENDED_LOCK:
        return _ENDED.setdefault(os.path.abspath(run_dir), threading.Event())


def pretraining_starts(run_dir: str) -> None:
    """A fresh end signal for `run_dir`'s watcher, made before the watcher and pre-training
    start: an end signalled before the watcher looks is not lost, and one left by an earlier
    run of the same folder in this process (a retry, a sweep's variant) is not taken."""
    with _ENDED_LOCK:
        _ENDED[os.path.abspath(run_dir)] = threading.Event()


def pretraining_ended(run_dir: str) -> None:
    """Tell this process's watcher of `run_dir` that pre-training is over (done or failed)."""
    _ended_event(run_dir).set()


def watch(cfg: DagConfig, run_dir: str, poll_seconds: float = POLL_SECONDS,
          log: Callable[[str], None] = logger.info) -> dict[str, list[str]]:
    """Probe `run_dir`'s exports as they appear until pre-training has ended (`pretraining_ended`
    was called, or the stage's manifest is there), then the rest. Returns the job names by
    outcome over the whole watch."""
    ended = _ended_event(run_dir)
    seen: set[str] = set()
    total: dict[str, list[str]] = {"ran": [], "reused": [], "failed": []}
    while True:
        # read before the scan: an export renamed into place before the end is in this scan
        finished = ended.is_set() or storage.read_manifest(run_dir) is not None
        for outcome, names in run_probes(cfg, run_dir, seen, log).items():
            total[outcome] += names
        if finished:
            if any(total.values()):
                log(f"probes: {len(total['ran'])} run, {len(total['reused'])} reused, "
                    f"{len(total['failed'])} failed")
            return total
        ended.wait(poll_seconds)


def results(cfg: DagConfig, run_dir: str) -> list[dict]:
    """The finished probe results of `run_dir`'s exports, by step then task."""
    if not cfg.finetune.probe.tasks or not cfg.finetune.data:
        return []
    return [read_result(job) for job in probe_jobs(cfg, run_dir) if os.path.exists(job.results)]


# ---------------------------------------------------------------- decays

def decay_exports(start_dir: str, start_step: int, run_dir: str, steps: int
                  ) -> list[ProbeExport]:
    """A decay's two ends by the stable run's global step: the export of the stable checkpoint
    it starts from (`start_step`: the weights of the stable run's probe export there, if it has
    one, so that result is reused) and its own final export, `steps` later."""
    return [ProbeExport(step, hf_dir, storage.sha256_file(os.path.join(hf_dir, WEIGHTS)))
            for step, hf_dir in ((start_step, start_dir),
                                 (start_step + steps, os.path.join(run_dir, "hf")))]


def probe_decay(cfg: DagConfig, exports: list[ProbeExport],
                log: Callable[[str], None] = logger.info) -> dict[str, list[str]]:
    """Probe a decay's exports (`decay_exports`) with the run's probe tasks, one process at a
    time; their weights are stages' outputs, so none is deleted after. Returns the job names by
    outcome (ran, reused, failed)."""
    outcomes: dict[str, list[str]] = {"ran": [], "reused": [], "failed": []}
    for job in probe_jobs(cfg, "", exports):
        outcomes[run_probe(job, log)].append(job.name)
    return outcomes


def decay_results(cfg: DagConfig, exports: list[ProbeExport]) -> list[dict]:
    """The finished probe results of a decay's exports, each at its export's global step."""
    if not enabled(cfg):
        return []
    return [{**read_result(job), "global_step": job.export.global_step}
            for job in probe_jobs(cfg, "", exports) if os.path.exists(job.results)]


# ---------------------------------------------------------------- the probe process

def probe_one(spec: dict[str, Any]) -> dict:
    """Fine-tune `spec`'s task on its export and score it on dev; write `results.json`."""
    import torch

    from common import settings
    from finetune import loop
    from finetune.checkpoint import check_model_fits, load_encoder, load_tokenizer
    from finetune.options import FinetuneConfig
    from finetune.tasks import get_task
    from finetune.user import use_task_file

    torch.set_num_threads(spec["num_threads"])
    use_task_file(spec["tasks_file"])
    entry, hf_dir = get_task(spec["task"]), spec["hf_dir"]
    ft = settings.build(FinetuneConfig, spec["loop"])
    encoder, tokenizer = load_encoder(hf_dir), load_tokenizer(hf_dir)
    check_model_fits(encoder, tokenizer, ft.max_seq_length, hf_dir, hf_dir)
    prepared = entry.family.prepare(entry.task, spec["data"], tokenizer, ft.max_seq_length,
                                    ft.max_train_examples, ft.max_eval_examples, ft.skip_bad_rows)
    print(f"probe {entry.task} on step {spec['global_step']}: fine-tuning "
          f"{prepared.num_train_examples} examples", file=sys.stderr, flush=True)
    result, _ = loop.run_one(entry.family, encoder, prepared, ft.learning_rates[0], ft.seeds[0],
                             ft)
    record = {"task": entry.task, "family": entry.family.name,
              "global_step": spec["global_step"], "weights_sha256": spec["weights_sha256"],
              "hf_dir": hf_dir, "metrics": result.metrics, "score": result.score,
              "steps": result.steps, "final_loss": result.final_loss,
              "num_train": prepared.num_train_examples,
              "seconds": round(result.train_seconds + result.eval_seconds, 2),
              "finished_ms": int(time.time() * 1000), "loop": spec["loop"]}
    storage.makedirs(spec["out"])
    storage.atomic_write_json(os.path.join(spec["out"], RESULTS), record)
    return record


def main(argv: list[str] | None = None) -> None:
    """`python -m flows.probes [--parent PID] SPEC`: one probe (SPEC: a job's JSON,
    `probe_command`), killed when process PID (its flow) dies. A bad input prints one line and
    exits 2."""
    from common.errors import USER_ERRORS, debug_requested, is_user_error
    from pipelines.beam_worker import die_with_parent

    parser = argparse.ArgumentParser(prog="python -m flows.probes", description=main.__doc__)
    parser.add_argument("--parent", type=int, default=None,
                        help="the flow's process id: the probe is killed when it dies")
    parser.add_argument("spec", help="the probe job as JSON")
    args = parser.parse_args(argv)
    if args.parent is not None:
        # A probe fine-tunes for up to finetune.probe.timeout_minutes: orphaned by a killed
        # flow, it would go on and write its result after the kill.
        die_with_parent(args.parent, prog="probe")
    try:
        probe_one(json.loads(args.spec))
    except USER_ERRORS as e:
        if debug_requested() or not is_user_error(e):
            raise
        print(f"probe: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
