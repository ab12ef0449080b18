"""Pre-training settings by their old names: the flat layout's (`zero_stage`, `model=bert_base`,
each section's fields at the top level) and a section's renamed field (`data.masked_lm_prob`),
each with its dotted name in the sections (training/config_sections.py). `bert-pretrain` and
the flow's `pretrain.*` settings refuse an old name naming the new one (`renamed_error`); a
run's own `config.json` saved in the flat layout loads as its sections (`migrate_flat`, through
training/config.py `load_saved`), so such runs resume.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common import settings
from training.config_sections import SECTIONS

NEVER_FLAT = ("preset", "name", "probe_every", "report_to", "arch", "max_position_embeddings",
              "schedule", "decay_shape", "dynamic_masked_lm_prob_end")
"""Section fields the flat layout did not have under their own name (`model`, `objective` and
`optimizer` named the preset, objective and optimizer) or at all (the encoder's arch and
longest row, the schedule)."""
RENAMED_FIELDS = {"data.masked_lm_prob": "data.dynamic_masked_lm_prob"}
"""A section's field renamed: old dotted name -> new (make_shards' `masked_lm_prob` is another
setting, with another default). `bert-pretrain` and the flow (`pretrain.<old>`) refuse the old
name naming the new one; `load_saved` reads a saved config's value under the new name."""
_OLD_NAMES = {new: old for old, new in RENAMED_FIELDS.items()}

RENAMED_SETTINGS = {
    **{_OLD_NAMES.get(f"{section}.{f.name}", f".{f.name}").partition(".")[2]:
       f"{section}.{f.name}" for section, cls in SECTIONS.items()
       for f in dataclasses.fields(cls) if f.name not in NEVER_FLAT},
    "model": "model.preset", "objective": "objective.name", "optimizer": "optimizer.name"}
"""Flat setting -> its name in the sections (`zero_stage` -> `engine.zero_stage`, `model` ->
`model.preset`, `masked_lm_prob` -> `data.dynamic_masked_lm_prob`). `bert-pretrain` and the
flow (`pretrain.<old>`) refuse the flat name naming the new one; `load_saved` moves a flat
saved config's values there."""


def _is_flat(key: str, value: Any) -> bool:
    """Whether `key: value` is a setting of the flat layout: `model`, `objective` and
    `optimizer` are sections too, so set to a mapping they are the sections, set to a value
    the flat layout's settings."""
    return key in RENAMED_SETTINGS and not (key in SECTIONS and isinstance(value, Mapping))


def renamed_error(overrides: Mapping[str, Any]) -> str | None:
    """The one-line error for the first flat setting (`RENAMED_SETTINGS`) in `overrides` (a
    nested mapping of a PretrainConfig's settings), else None."""
    for key, value in overrides.items():
        if _is_flat(key, value):
            return f"setting {key} was renamed: it is now {RENAMED_SETTINGS[key]}"
    for old, new in RENAMED_FIELDS.items():
        section, _, name = old.partition(".")
        if isinstance(overrides.get(section), Mapping) and name in overrides[section]:
            return f"setting {old} was renamed: it is now {new}"
    return None


def migrate_flat(data: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config in the flat layout (each section's fields at the top level: the
    `config.json` of runs saved in that layout) in the sections' layout; one in the
    sections' layout unchanged but for a renamed field's value (`RENAMED_FIELDS`), read under
    its new name."""
    moved: dict[str, Any] = {}
    for key, value in data.items():
        if _is_flat(key, value):
            section, _, name = RENAMED_SETTINGS[key].partition(".")
            moved = settings.merge(moved, {section: {name: value}})
        else:
            moved = settings.merge(moved, {key: value})
    for old, new in RENAMED_FIELDS.items():
        (section, _, name), (_, _, new_name) = old.partition("."), new.partition(".")
        if isinstance(moved.get(section), Mapping) and name in moved[section]:
            fields = dict(moved[section])
            fields[new_name] = fields.pop(name)
            moved[section] = fields
    return moved
