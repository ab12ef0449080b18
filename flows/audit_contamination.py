"""The contamination audit's command line: named fine-tuning tasks' evaluation sets, read by
their families, audited against a corpus (the Beam job pipelines/audit_contamination.py).

    beam run flows/audit_contamination.py --input out/corpus --output out/audit \\
        --eval_data /data/finetune --tasks rte,mrpc,squad1,swag,conll2003 --ngram 13
    python -m flows.audit_contamination --input out/corpus --output out/audit \\
        --eval_data /data/finetune --tasks_file tasks.yaml --tasks user,rte

`--eval_data` and `--tasks` are the flow's `finetune.data` and `finetune.tasks`, `--tasks_file`
its `finetune.tasks_file`. Each task's family reads the splits it scores
(finetune/eval_sets.py); the Beam job, which knows no task, is handed their texts. It runs
where the job runs: `--runner=DataflowRunner` and Beam's other flags pass through to it.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from common.settings import check
from finetune.tasks import TaskEntry
from pipelines import audit_contamination as job
from pipelines import jobs


def audit(config: job.AuditConfig, entries: Sequence[TaskEntry], beam_args: Sequence[str] = (),
          skip_bad_records: bool = False) -> dict:
    """Audit `config.input` against the evaluation sets of `entries` under `config.eval_data`.
    The manifest names the built-in tasks, whose files it hashes; a task file's tasks are
    hashed by their texts (`AuditConfig.tasks`)."""
    from finetune.eval_sets import read_eval_texts

    splits = read_eval_texts(config.eval_data, entries, skip_bad_records)
    builtin = tuple(e.task for e in entries if e.family.name != "user")
    return job.run(dataclasses.replace(config, tasks=builtin), beam_args, eval_splits=splits)


def build_parser() -> argparse.ArgumentParser:
    """The job's flags (one per `AuditConfig` field) and the task file's."""
    parser = jobs.config_parser(__doc__.splitlines()[0], job.AuditConfig)
    parser.add_argument("--tasks_file", metavar="FILE",
                        help="your own tasks (YAML, finetune/user): --tasks may name them")
    return parser


def main(argv: Sequence[str] | None = None) -> dict:
    """Flags -> `AuditConfig` and the tasks' entries -> `audit`."""
    from finetune.tasks import parse_tasks
    from finetune.user import use_task_file

    args, beam_args = build_parser().parse_known_args(argv)
    config = jobs.config_from_args(args, job.AuditConfig(input=args.input, output=args.output))
    check(bool(config.tasks), "tasks", "no task given")
    if args.tasks_file:
        use_task_file(args.tasks_file)
    try:
        entries = parse_tasks(",".join(config.tasks))
        check(bool(config.eval_data) or all(e.family.name == "user" for e in entries),
              "eval_data", "is required: the folder of the evaluation sets (the flow's "
              "finetune.data)")
        return audit(config, entries, beam_args)
    finally:
        if args.tasks_file:
            use_task_file(None)


if __name__ == "__main__":
    sys.exit(jobs.main(job.NAMESPACE, main, prog="python -m flows.audit_contamination"))
