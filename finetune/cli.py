"""`bert-finetune`: fine-tune a checkpoint on the paper's downstream tasks, every family with
one loop, and print one results table.

    bert-finetune --model <checkpoint folder> --data <data folder> \\
        --tasks squad1,squad2,swag,conll2003,rte --output runs/finetune

`--data` holds one folder per family or task: `glue/` (a `download_glue_data.py` or Hugging
Face `datasets` GLUE folder), `squad/`, `swag/`, `conll2003/`, ... (finetune/tasks.py says which).
Each task's defaults are its family's recipe from the paper (GLUE: 128 tokens, batch 32, 3
epochs, rates 5e-5..2e-5; SQuAD v1.1: 384 tokens, batch 32, ...); a flag given overrides it for
every task. `--tasks` takes task names, family names (`glue` = its nine tasks) or `all`;
`--tasks_file tasks.yaml` adds your own tasks to them (CSV/TSV/JSONL classification and
regression, CoNLL tagging, SQuAD-format QA: the file's layout is in finetune/user/__init__.py);
its entries name their own files, so `--data` is needed only for built-in tasks.

The flags are the fields of `CommandConfig` (the flow's `finetune` settings, finetune/config.py,
and where this run reads and writes); `--config FILE` (YAML or JSON) and `--set field=value`
set the same fields, flags winning over `--set`, `--set` over the file.

Every task's files, the checkpoint and its tokenizer are checked before the first task trains
(a missing family folder is named then). Each (task, rate, seed) run is kept in
`<output>/runs/` as it finishes, under a hash of everything that decides it (finetune/run_store.py):
a re-run with the same settings, after a kill or a failure, reuses those and trains only the
runs missing. A run whose loss diverges is recorded as diverged and the others go on. The
results (`summary.md`, `results.json`, `config.json`, `<task>/` prediction files, the
dead-letter file) are rewritten as one set after each finished task, so a run that fails (a
full disk, every rate diverging) leaves an existing results folder's files as they were. A bad
input prints `bert-finetune: error: <message>` and exits 2 (`--debug` or BERT_DEBUG=1 shows the
traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common import errors, extras, logs, settings, storage
from common.errors import debug_requested, is_user_error

with extras.needed_by("bert-finetune"):  # without the train extra: one line, not a traceback
    from finetune.config import TasksConfig
    from finetune.family import Family, Recipe
    from finetune.invocation import run_tasks
    from finetune.options import FinetuneConfig, LoopOptions, TaskJob
    from finetune.report import markdown_table, write_report
    from finetune.results import FinetuneResult
    from finetune.run_store import RUNS_DIR

log = logging.getLogger("bert-finetune")

USER_ERRORS = (*errors.USER_ERRORS, FileExistsError, FloatingPointError)
"""What bad options or inputs cause (the jobs' kinds; a format error is a ValueError;
FloatingPointError is a diverged loss): one line on stderr and exit code 2, not a traceback."""


@dataclass(frozen=True)
class CommandConfig(TasksConfig):
    """`bert-finetune`'s settings: the tasks' (`TasksConfig`, the flow's `finetune` section,
    with the loop's options) and where this run reads and writes. Each field is a flag, a
    `--set` key and a `--config` file key."""

    model: str | None = None
    """Checkpoint folder (ours or Hugging Face BERT)."""
    vocab: str | None = None
    """Tokenizer folder; unset: the --model folder's tokenizer."""
    output: str | None = None
    """Folder for tables, plot and prediction files."""
    pack_sequences: bool = True
    """Pack several examples into each row of `row_length` tokens (every family: GLUE, SQuAD,
    multiple choice, NER); false pads each example to the batch's longest (--no_packing)."""
    predict_test: bool = True
    """Predict the test sets where present (families with leaderboard files: GLUE, SWAG) into
    <output>/submission/; false skips them (--no_test)."""
    num_threads: int | None = None
    """Torch CPU threads; unset: torch's (1 is faster on a busy machine)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        settings.check(self.num_threads is None or self.num_threads >= 1, "num_threads",
                       f"must be >= 1, got {self.num_threads}")

    def required(self) -> tuple[str, ...]:
        """The `REQUIRED` settings, `data` left out when a task file is given: its tasks name
        their own files (`task_jobs` asks for `data` when a built-in task is listed too)."""
        return tuple(name for name in REQUIRED if not (name == "data" and self.tasks_file))


REQUIRED = ("model", "data", "tasks", "output")
"""Settings with no default: a flag, a `--set` or the `--config` file gives each."""

FAMILY_OPTIONS = ("pack_sequences", "predict_test")
"""Settings that are fields of a family's dataclass, where it has them (`with_options`)."""

ALIASES = (
    ("--no_packing", "pack_sequences", "false", "pad instead of packing: --pack_sequences=false"),
    ("--no_test", "predict_test", "false", "no test-set predictions: --predict_test=false"),
    ("--no_progress", "progress", "false", "no progress bars: --progress=false"),
    ("--no_bf16", "bf16", "false", "float32 on a GPU as well: --bf16=false"),
)
"""(flag, field, value, help): flags that set a field to a fixed value."""

RENAMED_SETTINGS = {alias.removeprefix("--"): f"{field}={value} (the flag {alias} still works)"
                    for alias, field, value, _ in ALIASES}
"""Names that are flags but not settings: a `--set` or config-file key with one of them fails
naming the setting it stands for."""

GROUPS = {TasksConfig: "tasks and recipe (unset: each task's family recipe)",
          LoopOptions: "training loop (every task)"}
"""The help's section of the fields each class declares; other fields are the command's."""


def build_parser(prog: str = "bert-finetune", description: str | None = __doc__,
                 config_class: type = CommandConfig) -> argparse.ArgumentParser:
    """A flag per field of `config_class` (help from its docstring; bert-glue passes its own
    class), the `ALIASES`, `--config FILE`, `--set KEY=VALUE` and `--debug`."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE",
                   help="settings file (YAML or JSON: field: value); --set and flags win over it")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set a field (repeatable), e.g. --set learning_rates=2e-5,3e-5; flags "
                        "win over it")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of a bad-input error instead of one line")
    declared = {name: _group(owner) for name, owner in _declaring_class(config_class).items()}
    for klass, title in [(None, "command"), *GROUPS.items()]:
        group = p.add_argument_group(title)
        names = {name for name, owner in declared.items() if owner is klass}
        settings.add_config_flags(group, config_class, skip=set(declared) - names)
    for flag, field, value, help_text in ALIASES:
        p.add_argument(flag, dest=field, action="store_const", const=value, help=help_text)
    return p


def _group(owner: type) -> type | None:
    """The `GROUPS` class whose section lists the fields `owner` declares: `owner` itself, or
    the first class of `GROUPS` (from the last) that inherits it (`LoopOptions` shows the
    optimizer fields of common/optimizer.py); None: the command's own."""
    return next((klass for klass in reversed(GROUPS) if issubclass(klass, owner)), None)


def _declaring_class(cls: type) -> dict[str, type]:
    """Each field of the dataclass `cls` -> the class that declares it last in the MRO."""
    owners: dict[str, type] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            owners.update(dict.fromkeys(inspect.get_annotations(klass), klass))
    return owners


def command_config(args: argparse.Namespace, base: Any) -> Any:
    """`base` with the `--config` file, the `--set`s, then the flags given applied; an error
    names the setting as the user gave it (`--epochs: ...`, `--set epochs: ...`)."""
    given = settings.load_file(args.config) if args.config else {}
    assignments = settings.parse_assignments(args.set)
    for key in [*given, *assignments]:
        if key in RENAMED_SETTINGS:
            raise ValueError(f"setting {key} was renamed: it is now {RENAMED_SETTINGS[key]}")
    config = settings.apply(base, given, label=f"{args.config}: config key") if given else base
    config = settings.apply(config, assignments, label="--set")
    config = settings.config_from_flags(config, args)
    missing = [f"--{name}" for name in config.required() if not getattr(config, name)]
    if missing:
        raise ValueError(f"the following arguments are required: {', '.join(missing)}")
    return config


def config_from_args(args: argparse.Namespace, recipe: Recipe) -> FinetuneConfig:
    """The loop's settings for a task with `recipe`: the recipe, then the settings given."""
    return command_config(args, CommandConfig(data=None, tasks=())).for_recipe(recipe)


def with_options(family: Family, options: Any) -> Family:
    """`family` with the `FAMILY_OPTIONS` that `options` (a CommandConfig, or parsed flags)
    sets, where the family has them."""
    if not dataclasses.is_dataclass(family):
        return family
    names = {f.name for f in dataclasses.fields(family)}
    changes = {name: settings.convert_setting(f"--{name}", getattr(options, name), bool)
               for name in FAMILY_OPTIONS
               if name in names and getattr(options, name, None) is not None}
    return dataclasses.replace(family, **changes)


def task_jobs(config: CommandConfig) -> list[TaskJob]:
    """One job per task of `tasks`, a built-in task's data in `data/<folder>` (a task file's
    entry names its own files); every missing family folder is named at once, before anything
    is read."""
    from finetune.user import FAMILY as USER

    entries = config.task_entries()
    builtin = [e for e in entries if e.family.name != USER.name]
    if builtin and not config.data:
        raise ValueError("the following arguments are required: --data (the folder of the "
                         f"built-in tasks: {', '.join(e.task for e in builtin)}; a task "
                         "file's tasks name their own files)")
    if builtin and not os.path.isdir(config.data):
        raise FileNotFoundError(f"--data {config.data}: no such folder")
    missing: dict[str, list[str]] = {}
    for entry in builtin:
        if not os.path.isdir(os.path.join(config.data, entry.data_folder)):
            missing.setdefault(entry.data_folder, []).append(entry.task)
    if missing:
        raise FileNotFoundError(f"--data {config.data}: " + "; ".join(
            f"no {folder}/ folder (for {', '.join(tasks)})" for folder, tasks in missing.items()))
    # a task file's data folder is absolute: joined to any --data, it stays itself
    return [TaskJob(with_options(e.family, config), e.task,
                    os.path.join(config.data or "", e.data_folder), config.for_task(e))
            for e in entries]


@extras.reports_missing("bert-finetune")
def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build_parser(), argv, task_jobs, "summary.md",
                    CommandConfig(data=None, tasks=()))


def run_main(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             make_jobs: Callable[[Any], list[TaskJob]], markdown_name: str, base: Any) -> int:
    """Parse `argv` into `base`'s settings, run the jobs `make_jobs` gives, report; bad
    settings, task names and other bad inputs end in one line."""
    logs.add_verbose_flag(parser)
    args = parser.parse_args(argv)
    logs.setup(args.verbose)
    finished: list[str] = []
    config = base
    try:
        try:
            config = command_config(args, base)
            jobs_ = make_jobs(config)
        except ValueError as e:  # bad settings and task names, named in one line
            errors.exit_with_error(parser.prog, str(e))
        return run(config, jobs_, finished, markdown_name)
    except USER_ERRORS as e:
        if args.debug or debug_requested() or not is_user_error(e, USER_ERRORS):
            raise
        message = str(e).strip() or type(e).__name__
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        if finished:
            sys.stderr.write(f"{parser.prog}: the results of {', '.join(finished)} (finished "
                             f"before the error) are in {config.output}\n")
        return 2


def run(config: CommandConfig, jobs_: list[TaskJob], finished: list[str],
        markdown_name: str) -> int:
    """The whole command for its resolved settings and jobs; bad inputs raise (`run_main`
    turns them into one line). The names of the tasks whose results are written are appended
    to `finished`."""
    if config.num_threads is not None:
        import torch

        torch.set_num_threads(config.num_threads)
    resolved = {"model": config.model, "vocab": config.vocab, "data": config.data,
                "tasks": [j.task for j in jobs_],
                "config": dataclasses.asdict(jobs_[0].config),
                "task_configs": {j.task: dataclasses.asdict(j.config) for j in jobs_},
                "families": {j.family.name: _family_settings(j.family) for j in jobs_},
                "settings": dataclasses.asdict(config)}
    log.info("config hash %s (BERT_LOG_LEVEL=DEBUG prints it)", storage.config_hash(resolved))
    log.debug("resolved config:\n%s", json.dumps(resolved, indent=2))
    if os.path.exists(config.output) and not os.path.isdir(config.output):
        raise NotADirectoryError(f"--output {config.output}: exists and is not a folder")
    # config.json is written with the report, as one set: a run that fails before its first
    # task finishes leaves an existing results folder's files as they are.
    resolved |= {"config_hash": storage.config_hash(resolved)}

    def write_finished(partial: FinetuneResult) -> None:
        if partial.pending_tasks:  # the last task's report is written (and logged) below
            _write(partial, config.output, markdown_name, resolved)
            finished.append(partial.tasks[-1].task)
            log.info("%s done; results so far in %s", partial.tasks[-1].task, config.output)

    result = run_tasks(config.model, jobs_, jobs_[0].config, _data_label(config),
                            vocab_dir=config.vocab, on_task_done=write_finished,
                            runs_dir=storage.join(config.output, RUNS_DIR))
    paths = _write(result, config.output, markdown_name, resolved)
    sys.stdout.write(markdown_table(result))
    for kind, path in paths.items():
        log.info("wrote %s: %s", kind, path)
    return 0


def _data_label(config: CommandConfig) -> str:
    """What names the data in errors: `--data`, or the task file when it alone gives data."""
    return f"--data {config.data}" if config.data else f"--tasks_file {config.tasks_file}"


def _family_settings(family: Family) -> dict:
    return dataclasses.asdict(family) if dataclasses.is_dataclass(family) else {}


def _write(result: FinetuneResult, output_dir: str, markdown_name: str,
           resolved: dict) -> dict[str, str]:
    """The report of `result` with the resolved settings (`config.json`); a warning names the
    dead-letter files when records were set aside."""
    paths = write_report(result, output_dir, markdown_name, config=resolved)
    bad_rows = sum(t.bad_rows for t in result.tasks)
    if bad_rows:
        log.warning("%d malformed row(s) set aside (--skip_bad_rows) in %s", bad_rows,
                    ", ".join(p for k, p in paths.items() if k.startswith("dead_letter")))
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
