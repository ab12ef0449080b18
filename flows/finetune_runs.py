"""The flow's fine-tuning runs: every task x learning rate x seed of the `finetune` settings
(finetune/config.py `TasksConfig`) as one content-addressed run on a free device, one reading of
each task shared by its runs, and the best rate per task in one report."""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import storage
from flows.config import DagConfig, finetune_tasks
from flows.devices import device_pool
from flows.stages import StageResult, run_stage

logger = logging.getLogger("flows")


@dataclass(frozen=True)
class FinetuneJob:
    """One fine-tuning run of the fan-out."""
    family: str
    task: str
    """The task's registry name ("rte", "squad1")."""
    learning_rate: float
    seed: int


def loop_config(cfg: DagConfig, entry):
    """The loop's config of one task's runs (finetune.options `FinetuneConfig`), no progress bars:
    the runs share one log. (Each run's device is the pool's, given when it starts.)"""
    return cfg.finetune.for_task(entry, progress=False)


def finetune_jobs(cfg: DagConfig) -> list[FinetuneJob]:
    """tasks x learning rates x seeds (several seeds only for a family's small tasks, as the
    paper), each task with its family's recipe and the settings given."""
    from finetune.capabilities import seeds_for

    if not cfg.finetune.data:
        return []
    jobs = []
    for entry in finetune_tasks(cfg):
        ft = loop_config(cfg, entry)
        jobs += [FinetuneJob(entry.family.name, entry.task, lr, seed)
                 for lr in ft.learning_rates for seed in seeds_for(entry.family, entry.task, ft)]
    return jobs


def finetune_run(cfg: DagConfig, model: StageResult, job: FinetuneJob) -> dict:
    """Fine-tune one (task, learning rate, seed) on a free device; its dev result, prediction
    files and test predictions.

    Content-addressed like every stage (the device is not part of the key): a re-run reuses a
    finished fine-tuning run."""
    from finetune.tasks import get_task
    from finetune.user import use_task_file

    use_task_file(cfg.finetune.tasks_file)  # this process's registry knows the file's tasks

    entry = get_task(job.task)
    ft, data = loop_config(cfg, entry), os.path.join(cfg.finetune.data, entry.data_folder)
    recipe = cfg.finetune.recipe(entry)
    config = {"job": dataclasses.asdict(job), "data": data, "recipe": recipe}
    if job.family == "user":  # an edited task definition is another run
        config["definition"] = dataclasses.asdict(entry.family)
    name = f"{job.family}-{job.task.lower()}-lr{job.learning_rate:g}-seed{job.seed}"

    def build(out: str) -> None:
        # reading needs no device; the runs of one task waiting for a device share one reading
        ready = _PREPARED.get((model.path, job.task, data, ft),
                              lambda: _Prepared(*_prepare_one(model, entry.family, job.task,
                                                              data, ft)))
        with device_pool().take() as device:
            result = _finetune_one(entry.family, ready.encoder, ready.prepared, job,
                                   dataclasses.replace(ft, device=device), cfg.output, name)
        storage.write_manifest(out, result)

    stage = run_stage(cfg.output, name, config, build, upstream=(model,))
    return {**stage.manifest, "cached": stage.cached}


@dataclass
class _Prepared:
    """One task's tokenized splits and the encoder they were checked against."""
    encoder: Any
    prepared: Any


class SharedPreparations:
    """Values built once per key and shared by the threads that hold them at the same time.

    The fan-out maps every (task, rate, seed) onto a thread, and each reads and tokenizes its
    task before it waits for a device: minutes per MNLI copy, and every waiting copy held in
    memory. Here the first run of a task prepares it while the others wait on that key alone;
    the entry lives while any run holds it (weak reference), so a finished task frees its memory.
    A preparation that fails fails the runs already waiting for it at once (a malformed row
    found after minutes of reading is not read again by each of them); a run that comes later
    tries again.
    """

    @dataclass
    class _Key:
        lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
        waiting: int = 0
        failure: str | None = None

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._keys: dict[Any, SharedPreparations._Key] = {}
        self._values: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        with self._guard:
            entry = self._keys.setdefault(key, self._Key())
            entry.waiting += 1
        try:
            with entry.lock:
                if entry.failure is not None:  # a fresh error: the first one's frames stay its own
                    raise RuntimeError(f"{entry.failure} (reading the task failed for the run "
                                       "before this one)")
                value = self._values.get(key)
                if value is None:
                    try:
                        value = build()
                    except Exception as error:
                        entry.failure = f"{type(error).__name__}: {error}"
                        raise
                    self._values[key] = value
                return value
        finally:
            with self._guard:
                entry.waiting -= 1
                if entry.waiting == 0:  # nobody waits: a later run starts afresh
                    del self._keys[key]


_PREPARED = SharedPreparations()


def _prepare_one(model: StageResult, family, task: str, data: str, ft):
    """(encoder, the task's encoded splits) for one run, checked against each other."""
    from finetune.capabilities import ModelChecks
    from finetune.checkpoint import check_model_fits, load_encoder, load_tokenizer

    encoder, tokenizer = load_encoder(model.path), load_tokenizer(model.path)
    # the export writes both from one run, but a hand-edited folder would fail deep in torch
    check_model_fits(encoder, tokenizer, ft.max_seq_length, model.path, model.path)
    if isinstance(family, ModelChecks):
        family.check_model(encoder, task, model.path)
    return encoder, family.prepare(task, data, tokenizer, ft.max_seq_length,
                                   ft.max_train_examples, ft.max_eval_examples, ft.skip_bad_rows)


def _finetune_one(family, encoder, prepared, job: FinetuneJob, ft, root: str = ".",
                  name: str | None = None) -> dict:
    from finetune import loop
    from training.trackers import local_dir

    # the trackers of `finetune.report_to` keep every run of the DAG run under its root
    result, trained = loop.tracked_run(family, encoder, prepared, job.learning_rate, job.seed,
                                       ft, local_dir(root), name)
    predictions = loop.predict_test_sets(family, trained, prepared, ft)
    return {"job": dataclasses.asdict(job), "result": dataclasses.asdict(result),
            "predictions": [dataclasses.asdict(p) for p in predictions],
            "num_train": prepared.num_train_examples, "bad_rows": len(prepared.bad_records),
            "bad_records": [dataclasses.asdict(b) for b in prepared.bad_records],
            "num_dev": dict(prepared.num_dev_examples)}


def outcome(job: FinetuneJob, state) -> dict:
    """A mapped run's result, or its failure, for the report."""
    if state.is_completed():
        return state.result()
    return {"job": dataclasses.asdict(job), "error": str(state.message or state.name)}


def finetune_best(cfg: DagConfig, model: StageResult, outcomes: list[dict],
                  out: str | None = None) -> dict:
    """Per task, the learning rate with the best mean dev score over seeds; one table over
    every family, the prediction files, in `out` (default `<root>/finetune`; a sweep gives each
    variant its own)."""
    from finetune import report
    from finetune.options import FinetuneConfig
    from finetune.results import FinetuneResult
    from finetune.tasks import get_task
    from finetune.user import use_task_file

    use_task_file(cfg.finetune.tasks_file)  # this process's registry knows the file's tasks

    failed = [o for o in outcomes if "error" in o]
    done = [o for o in outcomes if "error" not in o]
    tasks, configs = [], {}
    for name in dict.fromkeys(o["job"]["task"] for o in done):
        runs = [o for o in done if o["job"]["task"] == name]
        tasks.append(_task_result(runs))
        configs[tasks[-1].task] = loop_config(cfg, get_task(name))
    # one task's settings stand for all in results.json's "config"; each is in "task_configs"
    shared = next(iter(configs.values()), FinetuneConfig(progress=False))
    result = FinetuneResult(tuple(tasks), model.path, shared, configs=configs)
    out = out or storage.join(cfg.output, "finetune")
    files = report.write_report(result, out)
    dead_letters = [p for k, p in files.items() if k.startswith("dead_letter")]
    if dead_letters:
        logger.warning("fine-tuning: %d malformed record(s) set aside (finetune.skip_bad_rows) "
                       "in %s", sum(t.bad_rows for t in tasks), ", ".join(dead_letters))
    return {"table": report.markdown_table(result), **report.summary_scores(result),
            "failed": failed, "files": files, "output": out}


def _task_result(runs: list[dict]):
    """The task's summary by `finetune.results.select_best` (the CLI's rule): the prediction
    files and test predictions are those of the best seed at the best learning rate."""
    from finetune.results import RunResult, TestPredictions, select_best, summarise_task

    results = [RunResult(**o["result"]) for o in runs]
    name = results[0].task  # the family's own spelling ("RTE")
    # A rate that lost seeds to failed runs would be judged on fewer of them: compare only the
    # rates with every seed that any rate completed (the failures are in finetune_best's
    # "failed").
    seeds = Counter(r.learning_rate for r in results)
    complete = [r for r in results if seeds[r.learning_rate] == max(seeds.values())]
    if len(complete) < len(results):
        logger.warning("%s: learning rate(s) %s lost seeds to failed runs and are not compared",
                    name, sorted({r.learning_rate for r in results} -
                                 {r.learning_rate for r in complete}))
    best = select_best(complete)
    best_run = next(o for o, r in zip(runs, results) if r is best.best_run)
    return summarise_task(
        name, complete, num_train_examples=best_run["num_train"],
        num_dev_examples=best_run["num_dev"], bad_rows=best_run.get("bad_rows", 0),
        seconds=sum(r.train_seconds + r.eval_seconds for r in results),
        test_predictions=tuple(TestPredictions(**p) for p in best_run["predictions"]),
        # every run of a task read the same files: one run's rows set aside are the task's
        bad_records=tuple(_bad_record(b) for b in best_run.get("bad_records", ())),
        family=best_run["job"]["family"])


def _bad_record(fields: dict):
    """A record set aside, back from a run's manifest (with its raw text where it has one)."""
    from common.errors import BadRecord
    from finetune.glue.data import BadRow

    return BadRow(**fields) if "text" in fields else BadRecord(**fields)
