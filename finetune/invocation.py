"""One invocation of `bert-finetune` or `bert-glue`: several tasks fine-tuned one after the
other from one checkpoint (`run_tasks`), every task's files checked before the first trains
(`check_task_files`), each task's runs kept in a `finetune.run_store.RunStore`."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from finetune.capabilities import ModelChecks
from finetune.family import Family
from finetune.loop import finetune_task
from finetune.options import FinetuneConfig, TaskJob, resolve_device
from finetune.results import FinetuneResult, TaskResult


def check_task_files(tasks: Sequence[tuple[Family, str, str]], data_label: str) -> None:
    """Every (family, task, data folder)'s files, checked before any task trains; every
    problem in one error.

    FileNotFoundError when each problem is a missing file, else ValueError; a family's error
    may list several problems, one per line."""
    problems: list[str] = []
    all_missing = True
    for family, task, data_dir in tasks:
        try:
            family.check_files(task, data_dir)
        except (FileNotFoundError, ValueError) as error:
            problems += str(error).splitlines()
            all_missing &= isinstance(error, FileNotFoundError)
    if problems:
        kind = FileNotFoundError if all_missing else ValueError
        raise kind(f"{data_label}: {len(problems)} problem(s) found before any "
                   "fine-tuning:\n  " + "\n  ".join(problems))


def run_tasks(model_dir: str, jobs: Sequence[TaskJob], config: FinetuneConfig,
              data_label: str, vocab_dir: str | None = None,
              on_task_done: Callable[[FinetuneResult], None] | None = None,
              runs_dir: str | None = None) -> FinetuneResult:
    """Fine-tune the checkpoint in `model_dir` on each job's task, one after the other.

    The tokenizer is the one in `vocab_dir` if given, else the checkpoint folder's. Every data
    file, the checkpoint and the tokenizer are checked before the first task trains; after each
    task, `on_task_done` gets the result so far (the finished tasks, the others pending), so a
    later failure loses no finished work. With `runs_dir`, every (task, rate, seed) run is kept
    there as it finishes and reused by a re-run with the same settings (`RunStore`), so a
    crash loses only the run in flight. `config` is recorded as the settings all tasks share;
    `data_label` names the data in errors ("--data <folder>").
    """
    from finetune.checkpoint import check_model_fits, load_encoder, load_tokenizer
    from finetune.run_store import RunStore, model_identity

    if not jobs:
        raise ValueError("--tasks: no task given")
    start = time.perf_counter()
    for job in jobs:
        resolve_device(job.config.device)
        if not os.path.isdir(job.data_dir):
            raise FileNotFoundError(f"--data {job.data_dir}: no such folder")
    check_task_files([(j.family, j.task, j.data_dir) for j in jobs], data_label)
    encoder = load_encoder(model_dir)
    tokenizer_dir = vocab_dir or model_dir
    tokenizer = load_tokenizer(tokenizer_dir)
    check_model_fits(encoder, tokenizer, max(j.config.max_seq_length for j in jobs), model_dir,
                     tokenizer_dir)
    for job in jobs:
        if isinstance(job.family, ModelChecks):
            job.family.check_model(encoder, job.task, model_dir)
    identity = model_identity(model_dir, tokenizer_dir) if runs_dir is not None else None
    results: list[TaskResult] = []
    configs: dict[str, FinetuneConfig] = {}
    for i, job in enumerate(jobs):
        cfg = job.config
        prepared = job.family.prepare(job.task, job.data_dir, tokenizer, cfg.max_seq_length,
                                      cfg.max_train_examples, cfg.max_eval_examples,
                                      cfg.skip_bad_rows)
        store = None if identity is None else RunStore.for_job(runs_dir, identity, job)
        results.append(finetune_task(job.family, encoder, prepared, cfg, store))
        configs[prepared.task] = cfg
        combined = FinetuneResult(tuple(results), model_dir, config,
                                  time.perf_counter() - start,
                                  tuple(j.task for j in jobs[i + 1:]), dict(configs))
        if on_task_done is not None:
            on_task_done(combined)
    return combined
