"""The evaluation sets the fine-tuning flow scores, read with fine-tuning's own readers.

Tasks are named as `finetune.tasks.parse_tasks` takes them (task names, family names or
"all"), their data in `<data>/<the task's folder>` as the flow's `finetune.data` and
`finetune.tasks` settings give it (finetune/config.py). Per family, the splits scored and the
text fields of one example:

| family          | splits                                  | example id | text fields |
|-----------------|-----------------------------------------|------------|-------------|
| glue            | every dev file, every test file present | guid (row) | the one or two sentences |
| squad           | dev                                     | question id | context, question |
| multiple_choice | dev, test where present                 | id (row)   | sequence A (SWAG: sent1; Cosmos QA: context + question), each choice (SWAG: sent2 + ending) |
| ner             | dev, test where present                 | first line | the sentence's words joined by spaces |

A file the reader refuses raises its reader's one-line error (file and line). A task file's
tasks (the `user` family) have no reader here: their files are read by the caller, which hands
the audit their `EvalSplit`s (flows/steps.py, with finetune/user/eval_texts.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pipelines.contamination.index import ExampleKey


@dataclass(frozen=True)
class EvalSplit:
    """One evaluation split: where it was read from and its examples' text fields."""

    task: str
    split: str
    files: tuple[str, ...]
    """The files read (their hashes address the audit's output)."""
    examples: tuple[tuple[ExampleKey, tuple[str, ...]], ...]


def eval_split(task: str, split: str, files: Sequence[str],
           examples: Iterable[tuple[str, tuple[str, ...]]]) -> EvalSplit:
    """An `EvalSplit` of (example id, text fields) pairs."""
    return EvalSplit(task, split, tuple(files), tuple(
        (ExampleKey(task, split, example_id), texts) for example_id, texts in examples))


def _glue(task: str, folder: str) -> list[EvalSplit]:
    from finetune.glue import data
    from finetune.glue.tasks import get_task

    spec = get_task(task)
    splits = [data.read_split(folder, spec, s) for s in spec.dev]
    splits += [data.read_split(folder, spec, s) for s in spec.test
               if data.has_split(folder, spec, s)]
    return [eval_split(task, s.split, s.path.split(","),
                   ((e.guid, (e.text_a, e.text_b or "")) for e in s.examples)) for s in splits]


def _squad(task: str, folder: str) -> list[EvalSplit]:
    from finetune.squad import data

    dev = data.read_squad(data.split_path(folder, task, "dev"), training=False,
                          version_2=task == "squad2")
    return [eval_split(task, "dev", [dev.path],
                   ((e.qid, (e.context, e.question)) for e in dev.examples))]


def _multiple_choice(task: str, folder: str) -> list[EvalSplit]:
    from finetune.multiple_choice import data

    spec = data.SPECS[task]
    splits = {"dev": data.read_split(folder, spec, "dev")}
    if spec.test_file is not None and os.path.isfile(spec.path(folder, "test")):
        splits["test"] = data.read_choice_file(spec.path(folder, "test"), spec, labelled=False)
    return [eval_split(task, name, [s.path], ((e.example_id, (e.first, *e.choices))
                                          for e in s.examples)) for name, s in splits.items()]


def _ner(task: str, folder: str) -> list[EvalSplit]:
    from finetune.ner import data
    from finetune.ner.tasks import NER_TASKS

    spec = NER_TASKS[task]
    paths = {"dev": os.path.join(folder, spec.dev), "test": os.path.join(folder, spec.test)}
    splits = {name: data.read_conll(path, spec.format) for name, path in paths.items()
              if name == "dev" or os.path.isfile(path)}
    return [eval_split(task, name, [s.path], ((f"line {x.line}", (" ".join(x.words),))
                                          for x in s.sentences)) for name, s in splits.items()]


READERS: dict[str, Callable[[str, str], list[EvalSplit]]] = {
    "glue": _glue, "squad": _squad, "multiple_choice": _multiple_choice, "ner": _ner}
"""Family name (finetune/tasks.py) -> its evaluation splits of one task in its folder."""


def read_eval_sets(data: str, tasks: Sequence[str]) -> list[EvalSplit]:
    """Every evaluation split of `tasks` (names as `--tasks` takes them) under `data`."""
    from finetune.tasks import parse_tasks

    splits: list[EvalSplit] = []
    for entry in parse_tasks(",".join(tasks)):
        folder = os.path.join(data, entry.data_folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--eval_data {data}: no {entry.data_folder}/ folder "
                                    f"(for {entry.task})")
        if entry.family.name not in READERS:
            raise ValueError(f"--tasks {entry.task}: the audit has no reader for the "
                             f"{entry.family.name} family's files; its caller reads them")
        splits += READERS[entry.family.name](entry.task, folder)
    return splits
