"""The evaluation texts of a task file's tasks: what the contamination audit looks for.

Per type, the splits and the text fields of one example (as pipelines/contamination/eval_sets.py
reads the built-in families'):

| type                                | splits                | example id        | text fields |
|-------------------------------------|-----------------------|-------------------|-------------|
| sequence_classification, regression | dev, test where given | id column, or row | text_a, text_b |
| token_classification                | dev, test where given | first line        | the sentence's words joined by spaces |
| extractive_qa                       | dev                   | question id       | context, question |

The flow reads them here and hands them to the audit (flows/steps.py), so the Beam job needs
no task-file reader of its own. A file the reader refuses raises its reader's one-line error
(file and line); a classification file's labels are not read (the audit needs only the texts).
"""
from __future__ import annotations

from dataclasses import dataclass

from finetune.user.spec import SCHEMES, UserTask


@dataclass(frozen=True)
class EvalTexts:
    """One evaluation file of a task: its split, path and examples."""

    split: str
    path: str
    examples: tuple[tuple[str, tuple[str, ...]], ...]
    """(example id, text fields) of every example, in file order."""


def eval_texts(task: UserTask, skip_bad_rows: bool = False) -> list[EvalTexts]:
    """The evaluation splits of `task`: dev, and the test file where its type reads one."""
    if task.type == "token_classification":
        return _conll(task, skip_bad_rows)
    if task.type == "extractive_qa":
        return _qa(task)
    return _table(task, skip_bad_rows)


def _files(task: UserTask) -> dict[str, str]:
    return {"dev": task.dev, **({"test": task.test} if task.test is not None else {})}


def _table(task: UserTask, skip_bad_rows: bool) -> list[EvalTexts]:
    from finetune.user import readers
    from finetune.user.family import glue_spec

    spec = glue_spec(task)
    splits = []
    for split, path in _files(task).items():
        read = readers.read_split(task, spec, split, path, labelled=False,
                                  skip_bad_rows=skip_bad_rows)
        splits.append(EvalTexts(split, path, tuple(
            (e.guid, (e.text_a, e.text_b or "")) for e in read.examples)))
    return splits


def _conll(task: UserTask, skip_bad_rows: bool) -> list[EvalTexts]:
    from finetune.ner.data import NerFormat, read_conll

    fmt = NerFormat(task.num_columns, task.delimiter, SCHEMES[task.scheme])
    splits = []
    for split, path in _files(task).items():
        read = read_conll(path, fmt, skip_bad_records=skip_bad_rows)
        splits.append(EvalTexts(split, path, tuple(
            (f"line {s.line}", (" ".join(s.words),)) for s in read.sentences)))
    return splits


def _qa(task: UserTask) -> list[EvalTexts]:
    from finetune.squad.data import read_squad

    dev = read_squad(task.dev, training=False, version_2=task.version_2)
    return [EvalTexts("dev", task.dev, tuple(
        (e.qid, (e.context, e.question)) for e in dev.examples))]
