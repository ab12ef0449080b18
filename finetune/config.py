"""The fine-tuning settings a user gives for a set of tasks: `TasksConfig`.

One dataclass serves both entry points: it is the flow's `finetune` section (flows/config.py;
`bert-dag` fans its tasks x learning rates x seeds out, flows/finetune_runs.py), and
`bert-finetune`/`bert-glue` generate their flags from it (finetune/cli.py). Its recipe fields
replace each family's recipe for every task where set (unset: the family's, the paper's); the
loop's own options are `finetune.options.LoopOptions`, inherited as they are, so each setting is
declared once. `for_task` gives the loop's config of one task (`FinetuneConfig`).
`ProbeConfig` is the flow's alone (its `finetune.probe`, flows/config.py `FlowTasksConfig`):
the cheap slices that score pre-training's intermediate exports while it trains
(flows/probes.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.settings import check
from finetune.family import check_recipe
from finetune.options import RECIPE_FIELDS, FinetuneConfig, LoopOptions, for_recipe

GLUE_TASKS = ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli")


@dataclass(frozen=True)
class ProbeConfig:
    """Probes: cheap fine-tuning slices that score pre-training's intermediate exports while it
    trains (flows/probes.py; the exports are `pretrain.cadence.probe_every`'s). One learning
    rate, one seed, small slices: a trend per task, not a leaderboard score."""

    tasks: tuple[str, ...] = ("sst-2", "mrpc", "rte", "squad1")
    """Tasks probed on every export (names finetune/tasks.py knows, data in finetune.data);
    empty: no probes."""
    max_train_examples: int = 128
    """Training examples per probe (a fixed random subset)."""
    max_eval_examples: int = 128
    """Dev examples scored per probe (a fixed random subset)."""
    epochs: float = 1.0
    """Passes over the probe's training examples."""
    learning_rate: float = 1e-4
    """The one peak learning rate of every probe."""
    seed: int = 1
    """The one seed of every probe."""
    batch_size: int = 16
    """Training examples per optimizer step."""
    max_seq_length: int = 128
    """Tokens per sequence (SQuAD: per window)."""
    device: str = "cpu"
    """Where the probes run: cpu (beside pre-training's GPUs), cuda or cuda:N (a device of
    their own)."""
    num_threads: int = 1
    """Torch CPU threads per probe process (1 leaves the other cores to pre-training)."""
    timeout_minutes: float = 60.0
    """A probe process still running after this long is stopped and counted as failed, so one
    stuck probe never holds the report."""
    keep_exports: bool = False
    """Keep each export's weights after its probes. False: once every task has a result for an
    export, its `hf/` folder is deleted and its manifest (step, sha256) kept, so a long run
    holds about one export (BERT-large: 1.3 GB each) instead of one per probe step; a task added
    later cannot probe the deleted steps."""

    def __post_init__(self) -> None:
        for name in ("max_train_examples", "max_eval_examples", "batch_size", "num_threads"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.epochs > 0, "epochs", f"must be > 0, got {self.epochs}")
        check(self.timeout_minutes > 0, "timeout_minutes",
              f"must be > 0, got {self.timeout_minutes}")
        check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        check(2 <= self.max_seq_length <= 512, "max_seq_length",
              f"must be in 2..512, got {self.max_seq_length}")
        check(self.device == "cpu" or self.device.startswith("cuda"), "device",
              f"must be cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class TasksConfig(LoopOptions):
    """Which tasks, on what data, with which recipe values; the loop's options inherited."""

    data: str | None = ""
    """Folder holding one folder per family or task (glue/ in the glue_data layout, squad/,
    swag/, conll2003/, ...: finetune/tasks.py); "" skips fine-tuning in the flow; None: unset."""
    tasks: tuple[str, ...] = GLUE_TASKS
    """Tasks to fine-tune: task names (squad1,rte), family names (glue: its nine tasks) or all."""
    tasks_file: str | None = None
    """YAML file defining your own tasks (finetune/user: files, columns, labels, metric); their
    names join the known tasks (user: all of them)."""
    max_seq_length: int | None = None
    """Tokens per sequence (SQuAD: per window); unset: each task's family recipe (GLUE: 128,
    SQuAD: 384)."""
    batch_size: int | None = None
    """Training units per optimizer step; unset: each task's family recipe (GLUE: 32)."""
    epochs: float | None = None
    """Passes over the training units; unset: each task's family recipe (GLUE: 3)."""
    learning_rates: tuple[float, ...] = ()
    """Peak learning rates tried, the best on dev kept (comma-separated); empty: each task's
    family grid (GLUE: 5e-5,4e-5,3e-5,2e-5)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_recipe(self, unset_allowed=True)

    def task_names(self) -> str:
        return ",".join(self.tasks)

    def task_entries(self) -> list:
        """The registry entries of `tasks` (finetune/tasks.py), `tasks_file`'s tasks among the
        known ones; a bad task file is a ValueError naming the file and the entry."""
        from finetune.tasks import parse_tasks
        from finetune.user import use_task_file

        use_task_file(self.tasks_file)
        return parse_tasks(self.task_names())

    def for_task(self, entry, **changes) -> FinetuneConfig:
        """The loop's config for one registry entry (finetune/tasks.py): its family's recipe,
        the recipe values set here, the loop's options, then `changes` (where a run goes)."""
        return self.for_recipe(entry.family.recipe(entry.task), **changes)

    def for_recipe(self, recipe, **changes) -> FinetuneConfig:
        """The loop's config for a family's `recipe` with the values set here."""
        given = {name: getattr(self, name) for name in RECIPE_FIELDS
                 if getattr(self, name) not in (None, ())}
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(LoopOptions)}
        return for_recipe(recipe, **{**options, **given, **changes})

    def recipe(self, entry) -> dict:
        """What a run's folder is keyed on: the task's loop config without where it runs."""
        return {k: v for k, v in dataclasses.asdict(self.for_task(entry)).items()
                if k not in ("progress", "device")}
