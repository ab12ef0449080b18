"""The fine-tuning fan-out's settings: which tasks, and the recipe values that replace each
family's. `bert-dag` fans out tasks x learning rates x seeds with it (flows/fanout.py); each run
gets the loop's own config (`FinetuneConfig`) from `for_task`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GLUE_TASKS = ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli")


@dataclass(frozen=True)
class FanOutConfig:
    """Tasks x learning rates x seeds; a recipe value left unset (None, or () for the rates)
    takes each task's family recipe (the paper's)."""

    data: str | None = ""
    """Folder holding one folder per family or task (glue/ in the glue_data layout, squad/,
    swag/, conll2003/, ...: finetune/tasks.py); "" skips fine-tuning; None: unset."""
    tasks: tuple[str, ...] = GLUE_TASKS
    """Tasks to fine-tune (task names, or a family name for all its tasks)."""
    learning_rates: tuple[float, ...] = ()
    """Peak learning rates tried, the best on dev kept; () = each family's grid."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds for the small tasks (GLUE: CoLA, MRPC, STS-B, RTE, WNLI); others use the first."""
    epochs: float | None = None
    """Fine-tuning epochs; unset: the family's (GLUE: 3)."""
    batch_size: int | None = None
    """Fine-tuning batch size; unset: the family's (GLUE: 32)."""
    max_seq_length: int | None = None
    """Tokens per sequence; unset: the family's (GLUE: 128, SQuAD: 384)."""
    max_train_examples: int | None = None
    """Cap on training examples per task (unset: all), for quick runs."""
    max_eval_examples: int | None = None
    """Cap on dev examples per task (unset: all)."""
    skip_bad_rows: bool = False
    """Set malformed records aside (counted, written to finetune/dead_letter/) instead of
    failing the task's runs."""

    def task_names(self) -> str:
        return ",".join(self.tasks)

    def for_task(self, entry):
        """The loop's config (finetune/loop.py `FinetuneConfig`) for one registry entry: its
        family's recipe, then the values set here."""
        from finetune.loop import RECIPE_FIELDS, for_recipe

        given = {name: getattr(self, name) for name in RECIPE_FIELDS
                 if getattr(self, name) not in (None, ())}
        return for_recipe(entry.family.recipe(entry.task), **given, seeds=self.seeds,
                          max_train_examples=self.max_train_examples,
                          max_eval_examples=self.max_eval_examples,
                          skip_bad_rows=self.skip_bad_rows, progress=False)

    def recipe(self, entry) -> dict:
        """What a run's folder is keyed on: the task's loop config without where it runs."""
        return {k: v for k, v in dataclasses.asdict(self.for_task(entry)).items()
                if k not in ("progress", "device")}
