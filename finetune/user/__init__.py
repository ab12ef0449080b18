"""Your own fine-tuning tasks, defined in a YAML task file (`bert-finetune --tasks_file`).

    tasks:
      - name: my-mrpc
        type: sequence_classification   # regression, token_classification, extractive_qa
        format: tsv                      # csv, tsv, jsonl; token_classification: conll;
                                         # extractive_qa: squad
        train: glue/MRPC/train.tsv       # relative paths: from the task file's folder
        dev: glue/MRPC/dev.tsv
        test: glue/MRPC/test.tsv         # optional: classification predicts it (<name>.tsv),
                                         # token_classification scores it beside dev
        columns: {text_a: "#1 String", text_b: "#2 String", label: Quality, id: index}
        labels: ["0", "1"]               # as the data writes them; f1 is the second's
        metric: [f1, accuracy]           # one name or a list; the rate is picked on the mean
        recipe: {epochs: 3, learning_rates: [2e-5, 3e-5]}   # optional: the family's otherwise
      - name: my-ner
        type: token_classification
        format: conll
        train: conll2003/train.txt
        dev: conll2003/valid.txt
        num_columns: 4                   # fields per token line: the word first, the tag last
        delimiter: space                 # or tab
        labels: [O, B-PER, I-PER, B-LOC, I-LOC, B-ORG, I-ORG, B-MISC, I-MISC]
        scheme: IOB2                     # IOB1, IOB2 or BIOES (default: from the labels)
        metric: seqeval_f1
      - name: my-qa
        type: extractive_qa
        format: squad                    # the official SQuAD JSON, from any path
        train: qa/train.json
        dev: qa/dev.json
        version_2: false                 # true: unanswerable questions, v2.0 scoring
        metric: squad

Metrics by type: sequence_classification accuracy, f1, mcc; regression pearson, spearman;
token_classification seqeval_f1 (entity F1 as conlleval); extractive_qa squad (EM and F1).
`bert-finetune --tasks_file tasks.yaml --tasks my-mrpc,rte` runs them beside the built-in
tasks (`--tasks user`: every task of the file), with the same loop, packing, recipe grid,
seeds, report, prediction files and dead-letter file (`dead_letter/user_bad_rows.jsonl`).
Each is served by the built-in family of its type (`finetune.user.family`), so a task file
defining MRPC or CoNLL-2003 scores as the built-in task does on the same seeds. Every entry is
checked when the file is read: a problem is one line naming the file and the entry
(`finetune.user.spec`); the data files are checked before any training, and a bad row is one
line naming its file and line, or set aside with --skip_bad_rows.

The task registry (finetune/tasks.py) reads this package as any family's: `FAMILY`, `TASKS` and
`DATA_FOLDERS`. They are `REGISTRY`'s, a `UserTaskRegistry` holding the task file last given
to `use_task_file` (none until then; the flow and `bert-finetune` give theirs before looking
tasks up). A task's data folder, on which a re-run's reuse of finished runs is keyed with the
entry itself, is its train file's folder.
"""
from __future__ import annotations

import os

from finetune.user.family import UserFamily
from finetune.user.spec import TaskFileError, UserTask, load_task_file


class UserTaskRegistry:
    """The tasks of one task file, replaced as a whole by `use`: the family serving them, their
    names and their data folders always come from the same file."""

    def __init__(self) -> None:
        self.family = UserFamily()

    def use(self, path: str | None) -> tuple[UserTask, ...]:
        """Read the task file at `path` (None: no user tasks); a task named as a built-in one
        is an error naming the entry."""
        tasks = load_task_file(path) if path else ()
        _check_names(tasks)
        # a new family, not this one changed: a run holding the old one keeps its tasks
        self.family = UserFamily(tasks)
        return tasks

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.family.tasks)

    @property
    def data_folders(self) -> dict[str, str]:
        return {t.name: os.path.dirname(t.train) for t in self.family.tasks}


REGISTRY = UserTaskRegistry()
use_task_file = REGISTRY.use

_FAMILY_EXPORTS = {"FAMILY": "family", "TASKS": "task_names", "DATA_FOLDERS": "data_folders"}


def __getattr__(name: str):
    """`FAMILY`, `TASKS`, `DATA_FOLDERS`: `REGISTRY`'s, read when asked (PEP 562), so the task
    registry reads this package as it reads a built-in family's."""
    if name in _FAMILY_EXPORTS:
        return getattr(REGISTRY, _FAMILY_EXPORTS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_names(tasks: tuple[UserTask, ...]) -> None:
    """A user task's name must not stand for something else in --tasks."""
    from finetune.tasks import FAMILIES, _key, family_module

    taken = {_key(name): f"the family {name}" for name in FAMILIES} | {"all": "'all' tasks"}
    for family, package in FAMILIES.items():
        if package != __name__:
            taken |= {_key(t): f"the built-in {family} task {t}"
                      for t in family_module(family).TASKS}
    for task in tasks:
        if _key(task.name) in taken:
            raise TaskFileError(f"{task.source}: the name {task.name!r} is "
                                f"{taken[_key(task.name)]}; give it another name")


__all__ = ["DATA_FOLDERS", "FAMILY", "REGISTRY", "TASKS", "TaskFileError", "UserTaskRegistry",
           "use_task_file"]
