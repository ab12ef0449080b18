"""The task registry: which family fine-tunes a task, and where its data lies.

A family package (`finetune/<family>/__init__.py`) exports `FAMILY` (a `finetune.family.Family`)
and `TASKS` (its task names, lower case, e.g. ("squad1", "squad2")); it may export
`DATA_FOLDERS` ({task: folder under --data}) where a task's folder is not the family's name
(multiple choice: swag/, cosmosqa/). Adding a family is one line in `FAMILIES`: the loop, the
report and the contamination audit (its `eval_texts`, finetune/eval_sets.py) find it there. The
packages are imported only when a task is looked up, so one family's dependencies never load
for another's run.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass

from finetune.family import Family

FAMILIES: Mapping[str, str] = {
    "glue": "finetune.glue",
    "squad": "finetune.squad",
    "multiple_choice": "finetune.multiple_choice",
    "ner": "finetune.ner",
    "user": "finetune.user",
}
"""Family name -> the package exporting FAMILY and TASKS."""


@dataclass(frozen=True)
class TaskEntry:
    """One task of the registry."""

    task: str
    """The task's name as its family lists it ("rte", "squad2")."""
    family: Family
    data_folder: str
    """Its folder under the --data folder ("glue", "squad", "swag")."""


def family_module(name: str):
    """The package of family `name` (imported on first use)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown task family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[name])


def _key(name: str) -> str:
    """Names compare without case, dashes or underscores ("SST-2" = "sst2")."""
    return name.strip().lower().replace("-", "").replace("_", "")


def registry() -> dict[str, TaskEntry]:
    """Every known task by its name, in family order."""
    entries: dict[str, TaskEntry] = {}
    for name in FAMILIES:
        module = family_module(name)
        folders = getattr(module, "DATA_FOLDERS", {})
        for task in module.TASKS:
            if task in entries:
                raise ValueError(f"task {task!r} is listed by the families "
                                 f"{entries[task].family.name} and {name}")
            entries[task] = TaskEntry(task, module.FAMILY, folders.get(task, module.FAMILY.name))
    return entries


def get_task(name: str) -> TaskEntry:
    """The registry entry of a task name; an unknown name is an error listing the known."""
    entries = registry()
    for task, entry in entries.items():
        if _key(task) == _key(name):
            return entry
    raise ValueError(f"--tasks: unknown task {name.strip()!r}; known: {', '.join(entries)} "
                     f"(or a family: {', '.join(FAMILIES)}; or all)")


def parse_tasks(names: str) -> list[TaskEntry]:
    """Entries for a comma-separated list ("squad1,rte"); a family name means all its tasks,
    "all" every task."""
    parts = [n.strip() for n in names.split(",") if n.strip()]
    if not parts:
        raise ValueError("--tasks: no task given")
    entries: list[TaskEntry] = []
    for part in parts:
        if part.lower() == "all":
            entries += registry().values()
        elif part.lower() in FAMILIES:
            entries += [e for e in registry().values() if e.family.name == part.lower()]
        else:
            entries.append(get_task(part))
    if len({e.task for e in entries}) != len(entries):
        raise ValueError(f"--tasks: a task is listed twice in {names!r}")
    return entries
