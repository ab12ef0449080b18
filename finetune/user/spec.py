"""A task file read and checked: one `UserTask` per entry of its `tasks:` list.

Every problem is one `TaskFileError` line naming the file and the entry
("tasks.yaml: tasks[0] (my-mrpc): metric 'bleu' is not one of accuracy, f1, mcc"), raised
before any data file is read; the data files themselves are checked by `finetune.user.family`
before any training, and their rows when read.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from common.settings import SettingError
from finetune.family import Recipe

RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe))

TYPES = {
    # type: (formats, metrics, whether a label list is required)
    "sequence_classification": (("csv", "tsv", "jsonl"), ("accuracy", "f1", "mcc"), True),
    "regression": (("csv", "tsv", "jsonl"), ("pearson", "spearman"), False),
    "token_classification": (("conll",), ("seqeval_f1",), True),
    "extractive_qa": (("squad",), ("squad",), False),
}
"""What each task type reads and how it may be scored."""

SCHEMES = {"IOB1": "BI", "IOB2": "BI", "BIOES": "BIES"}
"""Tag schemes of token classification -> the tag prefixes they allow besides `O`."""

DELIMITERS = {"space": " ", "tab": "\t"}
"""CoNLL column delimiters by name (a literal " " or "\\t" is taken as well)."""

KEYS = {
    "common": ("name", "type", "format", "train", "dev", "test", "metric", "recipe"),
    "sequence_classification": ("columns", "labels"),
    "regression": ("columns",),
    "token_classification": ("labels", "num_columns", "delimiter", "scheme"),
    "extractive_qa": ("version_2",),
}
"""The keys an entry of each type may have."""

COLUMN_ROLES = ("text_a", "text_b", "label", "id")
"""Keys of a classification entry's `columns` (text_a and label required)."""


class TaskFileError(ValueError):
    """A task file or one of its entries that cannot define a task."""


@dataclass(frozen=True)
class UserTask:
    """One task defined in a task file, its paths absolute."""

    name: str
    """The task's name in --tasks and in the results."""
    type: str
    """One of `TYPES`."""
    format: str
    """csv, tsv, jsonl, conll or squad."""
    train: str
    dev: str
    test: str | None
    """Labelled test file (token classification: scored beside dev) or unlabelled one
    (classification: predicted as `<name>.tsv`); optional."""
    metrics: tuple[str, ...]
    """Metric names; the rate is picked on their mean (as GLUE scores MRPC: F1 and accuracy)."""
    columns: tuple[tuple[str, str], ...] = ()
    """(role, column name) pairs of a classification file (roles: `COLUMN_ROLES`)."""
    labels: tuple[str, ...] = ()
    """Class labels as written in the data, or the tag set of token classification."""
    num_columns: int = 0
    """Fields on each CoNLL token line (the word first, the tag last)."""
    delimiter: str = " "
    """What separates a CoNLL line's fields."""
    scheme: str = "IOB2"
    """Tag scheme of token classification (`SCHEMES`)."""
    version_2: bool = False
    """Extractive QA with unanswerable questions (SQuAD v2.0's scoring)."""
    recipe: tuple[tuple[str, Any], ...] = ()
    """Recipe values given (`finetune.family.Recipe` fields); the rest are the family's."""
    source: str = ""
    """"<task file>: tasks[<i>] (<name>)": where errors point."""

    def column(self, role: str) -> str | None:
        return dict(self.columns).get(role)


def load_task_file(path: str) -> tuple[UserTask, ...]:
    """The tasks of the YAML file at `path`, each checked (`TaskFileError` at the first bad
    entry); relative data paths are taken from the task file's folder."""
    from common.settings import load_file

    if not os.path.isfile(path):
        raise TaskFileError(f"--tasks_file {path}: no such file")
    try:
        document = load_file(path, yaml_loader=_labels_as_text_loader())
    except ValueError as e:
        raise TaskFileError(str(e)) from None
    entries = document.get("tasks")
    if set(document) != {"tasks"} or not isinstance(entries, list) or not entries:
        raise TaskFileError(f"{path}: expected one key, tasks: a non-empty list of task entries")
    tasks = tuple(parse_entry(entry, f"{path}: tasks[{i}]", os.path.dirname(os.path.abspath(path)))
                  for i, entry in enumerate(entries))
    names = [t.name.lower() for t in tasks]
    for task in tasks:
        if names.count(task.name.lower()) > 1:
            raise TaskFileError(f"{task.source}: the name {task.name!r} is used twice")
    return tasks


def _labels_as_text_loader() -> type:
    """A YAML loader that keeps each `labels:` item as the text written: YAML 1.1 reads
    `[yes, no]` as booleans and `01` as the number 1, but a label is compared with the data's
    text, so any other reading refuses every row."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            mapping = super().construct_mapping(node, deep=deep)
            for key, value in node.value:
                if (isinstance(key, yaml.ScalarNode) and key.value == "labels"
                        and isinstance(value, yaml.SequenceNode)
                        and all(isinstance(item, yaml.ScalarNode) for item in value.value)):
                    mapping["labels"] = [item.value for item in value.value]
            return mapping

    return Loader


def parse_entry(entry: Any, where: str, folder: str) -> UserTask:
    """One entry of the `tasks:` list; `where` names it in errors."""
    if not isinstance(entry, dict):
        raise TaskFileError(f"{where}: expected a mapping (name:, type:, format:, ...)")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise TaskFileError(f"{where}: no name")
    where = f"{where} ({name})"
    kind = _choice(entry, "type", tuple(TYPES), where)
    formats, metric_names, needs_labels = TYPES[kind]
    unknown = sorted(set(entry) - set(KEYS["common"]) - set(KEYS[kind]))
    if unknown:
        raise TaskFileError(f"{where}: unknown key(s) {', '.join(unknown)} for type {kind}; "
                            f"known: {', '.join(KEYS['common'] + KEYS[kind])}")
    fmt = _choice(entry, "format", formats, where)
    metrics = _metrics(entry.get("metric"), metric_names, where)
    labels = _labels(entry.get("labels"), needs_labels, kind, where)
    paths = {split: _path(entry, split, folder, where, required=split != "test")
             for split in ("train", "dev", "test")}
    extra = {"token_classification": _conll_keys, "extractive_qa": _qa_keys}.get(
        kind, _column_keys)(entry, labels, where)
    return UserTask(name=name.strip(), type=kind, format=fmt, **paths, metrics=metrics,
                    labels=labels, recipe=_recipe(entry.get("recipe"), where), source=where,
                    **extra)


def _choice(entry: dict, key: str, known: tuple[str, ...], where: str) -> str:
    value = entry.get(key)
    if value not in known:
        raise TaskFileError(f"{where}: {key} {value!r} is not one of {', '.join(known)}")
    return value


def _metrics(value: Any, known: tuple[str, ...], where: str) -> tuple[str, ...]:
    """`metric: f1` or `metric: [f1, accuracy]`."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise TaskFileError(f"{where}: metric must be one of {', '.join(known)}, or a list")
    for name in names:
        if name not in known:
            raise TaskFileError(f"{where}: metric {name!r} is not one of {', '.join(known)}")
    if len(set(names)) != len(names):
        raise TaskFileError(f"{where}: a metric is listed twice in {names}")
    return tuple(names)


def _labels(value: Any, required: bool, kind: str, where: str) -> tuple[str, ...]:
    if value is None:
        if required:
            raise TaskFileError(f"{where}: no labels (the list of labels as the data writes them)")
        return ()
    # a JSON true/false has no one spelling in the data: the labels must be written as text
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool)
                                              for v in value):
        raise TaskFileError(f"{where}: labels must be a list of strings")
    labels = tuple(str(v) for v in value)
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise TaskFileError(f"{where}: labels must be 2 or more distinct values, got {list(labels)}")
    return labels


def _path(entry: dict, split: str, folder: str, where: str, required: bool) -> str | None:
    value = entry.get(split)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise TaskFileError(f"{where}: no {split} file")
    return os.path.normpath(os.path.join(folder, os.path.expanduser(value)))


def _column_keys(entry: dict, labels: tuple[str, ...], where: str) -> dict:
    columns = entry.get("columns")
    if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
        raise TaskFileError(f"{where}: columns must map text_a, label (and text_b, id) to "
                            "column names")
    unknown = sorted(set(columns) - set(COLUMN_ROLES))
    missing = [role for role in ("text_a", "label") if role not in columns]
    if unknown or missing:
        raise TaskFileError(f"{where}: columns: " + "; ".join(
            ([f"unknown {', '.join(unknown)}"] if unknown else []) +
            ([f"missing {', '.join(missing)}"] if missing else [])) +
            f" (known: {', '.join(COLUMN_ROLES)})")
    return {"columns": tuple((role, columns[role]) for role in COLUMN_ROLES if role in columns)}


def _conll_keys(entry: dict, labels: tuple[str, ...], where: str) -> dict:
    num_columns = entry.get("num_columns")
    if not isinstance(num_columns, int) or num_columns < 2:
        raise TaskFileError(f"{where}: num_columns must be the fields of a token line, >= 2 "
                            f"(the word first, the tag last), got {num_columns!r}")
    delimiter = entry.get("delimiter", "space")
    delimiter = DELIMITERS.get(delimiter, delimiter)
    if delimiter not in DELIMITERS.values():
        raise TaskFileError(f"{where}: delimiter {entry.get('delimiter')!r} is not space or tab")
    scheme = entry.get("scheme", "BIOES" if any(t[:2] in ("E-", "S-") for t in labels) else "IOB2")
    if scheme not in SCHEMES:
        raise TaskFileError(f"{where}: scheme {scheme!r} is not one of {', '.join(SCHEMES)}")
    bad = [t for t in labels if t != "O" and not (t[:1] in SCHEMES[scheme] and t[1:2] == "-"
                                                  and len(t) > 2)]
    if bad or "O" not in labels:
        raise TaskFileError(f"{where}: labels must be O and {'/'.join(SCHEMES[scheme])}-<type> "
                            f"tags for scheme {scheme}; " +
                            (f"not {', '.join(bad)}" if bad else "O is missing"))
    return {"num_columns": num_columns, "delimiter": delimiter, "scheme": scheme}


def _qa_keys(entry: dict, labels: tuple[str, ...], where: str) -> dict:
    version_2 = entry.get("version_2", False)
    if not isinstance(version_2, bool):
        raise TaskFileError(f"{where}: version_2 must be true or false, got {version_2!r}")
    return {"version_2": version_2}


def _recipe(value: Any, where: str) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or set(value) - set(RECIPE_FIELDS):
        raise TaskFileError(f"{where}: recipe takes {', '.join(RECIPE_FIELDS)}, got {value!r}")
    values = dict(value)
    if "learning_rates" in values:
        rates = values["learning_rates"]
        rates = tuple(rates) if isinstance(rates, list) else (rates,)
        # YAML 1.1 reads 5e-5 (no dot) as text; the rate is meant
        values["learning_rates"] = tuple(_number(r) for r in rates)
    try:
        Recipe(**values)  # the recipe's own checks, in its own words
    except SettingError as e:
        raise TaskFileError(f"{where}: recipe: {e.setting} {e.message}") from None
    except (ValueError, TypeError) as e:
        raise TaskFileError(f"{where}: recipe: {e}") from None
    return tuple(values.items())


def _number(value: Any) -> Any:
    """`value` as a float where it is text that spells one, else as it is."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
