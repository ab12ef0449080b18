"""`bert-finetune`: fine-tune a checkpoint on the paper's downstream tasks, every family with
one loop, and print one results table.

    bert-finetune --model <checkpoint folder> --data <data folder> \
        --tasks squad1,squad2,swag,conll2003,rte --output runs/finetune

`--data` holds one folder per family or task: `glue/` (a `download_glue_data.py` or Hugging
Face `datasets` GLUE folder), `squad/`, `swag/`, `conll2003/`, ... (finetune/tasks.py says which).
Each task's defaults are its family's recipe from the paper (GLUE: 128 tokens, batch 32, 3
epochs, rates 5e-5..2e-5; SQuAD v1.1: 384 tokens, batch 32, ...); a flag given overrides it for
every task. `--tasks` takes task names, family names (`glue` = its nine tasks) or `all`.

Every task's files, the checkpoint and its tokenizer are checked before the first task trains
(a missing family folder is named then); the results (`summary.md`, `results.json`,
`<task>/` prediction files, the dead-letter file) are rewritten after each finished task. A bad
input prints `bert-finetune: error: <message>` and exits 2 (`--debug` or BERT_DEBUG=1 shows the
traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from common import errors, storage
from common.errors import debug_requested, is_user_error
from finetune import loop
from finetune.family import Family, Recipe
from finetune.loop import FinetuneConfig, FinetuneResult, TaskJob
from finetune.report import markdown_table, write_report

log = logging.getLogger("bert-finetune")

USER_ERRORS = (*errors.USER_ERRORS, FileExistsError, FloatingPointError)
"""What bad options or inputs cause (the jobs' kinds; a format error is a ValueError;
FloatingPointError is a diverged loss): one line on stderr and exit code 2, not a traceback."""

FAMILY_OPTIONS = {"pack_sequences": "no_packing", "predict_test": "no_test"}
"""Family settings (fields of a family's dataclass, where it has them) -> the flag that turns
them off."""


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")


def build_parser(prog: str = "bert-finetune", description: str | None = __doc__,
                 data_help: str = "folder with one folder per family (glue/, squad/, ...)",
                 tasks_help: str = "comma-separated tasks (squad1,rte), families (glue) or "
                                   "'all'",
                 recipe: str = "each task's family recipe") -> argparse.ArgumentParser:
    """The flags of `bert-finetune` (and of `bert-glue`, which names its own data and tasks).

    The recipe flags (`--max_seq_length`, `--batch_size`, `--epochs`, `--learning_rates`)
    default to None: each task's family recipe."""
    defaults = FinetuneConfig()
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (ours or Hugging Face BERT)")
    p.add_argument("--vocab", default=None,
                   help="tokenizer folder (default: the --model folder's tokenizer)")
    p.add_argument("--data", required=True, help=data_help)
    p.add_argument("--tasks", required=True, help=tasks_help)
    p.add_argument("--output", required=True, help="folder for tables, plot and prediction files")
    p.add_argument("--learning_rates", type=_floats, default=None,
                   help=f"comma-separated peak learning rates (default: {recipe})")
    p.add_argument("--seeds", type=_ints, default=defaults.seeds,
                   help="comma-separated seeds for small tasks; others use the first")
    p.add_argument("--epochs", type=float, default=None, help=f"default: {recipe}")
    p.add_argument("--batch_size", type=int, default=None, help=f"default: {recipe}")
    p.add_argument("--max_seq_length", type=int, default=None, help=f"default: {recipe}")
    p.add_argument("--eval_batch_size", type=int, default=defaults.eval_batch_size)
    p.add_argument("--warmup_proportion", type=float, default=defaults.warmup_proportion)
    p.add_argument("--weight_decay", type=float, default=defaults.weight_decay,
                   help="AdamW's decoupled weight decay (none on biases and LayerNorm)")
    p.add_argument("--adam_epsilon", type=float, default=defaults.adam_epsilon)
    p.add_argument("--max_grad_norm", type=float, default=defaults.max_grad_norm,
                   help="global gradient-norm clip (0 = off)")
    p.add_argument("--max_train_examples", type=int, default=None,
                   help="train on a fixed random subset of this many examples")
    p.add_argument("--max_eval_examples", type=int, default=None,
                   help="score a fixed random subset of this many dev examples")
    p.add_argument("--bf16", action="store_true", default=None,
                   help="bfloat16 autocast (default: on a GPU; faster on AVX-512 CPUs too)")
    p.add_argument("--no_bf16", dest="bf16", action="store_false",
                   help="float32 on a GPU as well")
    p.add_argument("--device", default=defaults.device,
                   help="auto (a GPU when torch sees one, else the CPU), cpu, cuda or cuda:N")
    p.add_argument("--no_packing", action="store_true",
                   help="pad each example to the batch's longest instead of packing rows "
                        "(families that pack: GLUE)")
    p.add_argument("--skip_bad_rows", action="store_true",
                   help="set malformed records aside (counted, and written with their text to "
                        "<output>/dead_letter/<family>_bad_rows.jsonl) instead of failing")
    p.add_argument("--no_test", action="store_true",
                   help="do not predict the test sets (families with leaderboard files: GLUE)")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    p.add_argument("--num_threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 is faster on a busy machine)")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of a bad-input error instead of one line")
    return p


def config_from_args(args: argparse.Namespace, recipe: Recipe) -> FinetuneConfig:
    """The loop's settings for a task with `recipe`: the recipe, then the flags given."""
    given = {name: getattr(args, name) for name in loop.RECIPE_FIELDS
             if getattr(args, name) is not None}
    return loop.for_recipe(
        recipe, **given, seeds=args.seeds, eval_batch_size=args.eval_batch_size,
        warmup_proportion=args.warmup_proportion, weight_decay=args.weight_decay,
        adam_epsilon=args.adam_epsilon, max_grad_norm=args.max_grad_norm, bf16=args.bf16,
        max_train_examples=args.max_train_examples, max_eval_examples=args.max_eval_examples,
        skip_bad_rows=args.skip_bad_rows, progress=not args.no_progress, device=args.device)


def with_options(family: Family, args: argparse.Namespace) -> Family:
    """`family` with the family settings the flags turn off (`FAMILY_OPTIONS`), where it has
    them."""
    if not dataclasses.is_dataclass(family):
        return family
    names = {f.name for f in dataclasses.fields(family)}
    changes = {name: not getattr(args, flag) for name, flag in FAMILY_OPTIONS.items()
               if name in names}
    return dataclasses.replace(family, **changes)


def task_jobs(args: argparse.Namespace) -> list[TaskJob]:
    """One job per `--tasks` entry, its data in `--data/<folder>`; every missing family folder
    is named at once, before anything is read."""
    from finetune.tasks import parse_tasks

    entries = parse_tasks(args.tasks)
    if not os.path.isdir(args.data):
        raise FileNotFoundError(f"--data {args.data}: no such folder")
    missing: dict[str, list[str]] = {}
    for entry in entries:
        if not os.path.isdir(os.path.join(args.data, entry.data_folder)):
            missing.setdefault(entry.data_folder, []).append(entry.task)
    if missing:
        raise FileNotFoundError(f"--data {args.data}: " + "; ".join(
            f"no {folder}/ folder (for {', '.join(tasks)})" for folder, tasks in missing.items()))
    return [TaskJob(with_options(e.family, args), e.task, os.path.join(args.data, e.data_folder),
                    config_from_args(args, e.family.recipe(e.task))) for e in entries]


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build_parser(), argv, task_jobs, "summary.md")


def run_main(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             make_jobs: Callable[[argparse.Namespace], list[TaskJob]],
             markdown_name: str) -> int:
    """Parse `argv`, run the jobs `make_jobs` gives, report; bad inputs end in one line."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    finished: list[str] = []
    try:
        return run(parser, args, finished, make_jobs, markdown_name)
    except USER_ERRORS as e:
        if args.debug or debug_requested() or not is_user_error(e, USER_ERRORS):
            raise
        message = str(e).strip() or type(e).__name__
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        if finished:
            sys.stderr.write(f"{parser.prog}: the results of {', '.join(finished)} (finished "
                             f"before the error) are in {args.output}\n")
        return 2


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, finished: list[str],
        make_jobs: Callable[[argparse.Namespace], list[TaskJob]], markdown_name: str) -> int:
    """The whole command for parsed `args`; bad inputs raise (`run_main` turns them into one
    line). The names of the tasks whose results are written are appended to `finished`."""
    if args.num_threads is not None and args.num_threads < 1:
        parser.error(f"--num_threads must be >= 1, got {args.num_threads}")
    try:
        jobs_ = make_jobs(args)
    except ValueError as e:  # bad flag values and task names: usage errors
        parser.error(str(e))
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    resolved = {"model": args.model, "vocab": args.vocab, "data": args.data,
                "tasks": [j.task for j in jobs_],
                "config": dataclasses.asdict(jobs_[0].config),
                "task_configs": {j.task: dataclasses.asdict(j.config) for j in jobs_},
                "families": {j.family.name: _family_settings(j.family) for j in jobs_}}
    log.info("resolved config (hash %s):\n%s", storage.config_hash(resolved),
             json.dumps(resolved, indent=2))
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise NotADirectoryError(f"--output {args.output}: exists and is not a folder")
    storage.makedirs(args.output)
    storage.atomic_write_json(storage.join(args.output, "config.json"),
                              resolved | {"config_hash": storage.config_hash(resolved)})

    def write_finished(partial: FinetuneResult) -> None:
        if partial.pending_tasks:  # the last task's report is written (and logged) below
            _write(partial, args.output, markdown_name)
            finished.append(partial.tasks[-1].task)
            log.info("%s done; results so far in %s", partial.tasks[-1].task, args.output)

    result = loop.run_tasks(args.model, jobs_, jobs_[0].config, args.data, vocab_dir=args.vocab,
                            on_task_done=write_finished)
    paths = _write(result, args.output, markdown_name)
    sys.stdout.write(markdown_table(result))
    for kind, path in paths.items():
        log.info("wrote %s: %s", kind, path)
    return 0


def _family_settings(family: Family) -> dict:
    return dataclasses.asdict(family) if dataclasses.is_dataclass(family) else {}


def _write(result: FinetuneResult, output_dir: str, markdown_name: str) -> dict[str, str]:
    """The report of `result`; a warning names the dead-letter files when records were set
    aside."""
    paths = write_report(result, output_dir, markdown_name)
    bad_rows = sum(t.bad_rows for t in result.tasks)
    if bad_rows:
        log.warning("%d malformed row(s) set aside (--skip_bad_rows) in %s", bad_rows,
                    ", ".join(p for k, p in paths.items() if k.startswith("dead_letter")))
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
