"""Typed settings: one override mechanism for every config in the project.

Every stage owns one frozen config dataclass; the flow's config is composed of them. Overrides
arrive as a nested mapping (a YAML/JSON file, a deployment's parameters) or as dotted
`key=value` text (`--set pretrain.phase1.steps=20`, `bert-pretrain --set phase1.steps=20`);
`apply` sets them on the config, each value converted to its field's declared type
(`convert_setting`), and a value that does not fit or that the config refuses is an error
naming the setting by its full path (`SettingError`), before anything runs. The Beam jobs'
flags are generated from the same dataclasses (`add_config_flags`).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def convert_setting(label: str, value: Any, hint: Any) -> Any:
    """`value` (a `--set` string or a JSON value) as the field's declared type.

    Tuples take a JSON list or a comma-separated string; bools take true/false/1/0/yes/no; a
    `Literal[...]` field takes one of its values. A value that does not fit is a ValueError
    starting `{label}={value!r}: `.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # `str | None`: None means "not set yet"
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return convert_setting(label, value, hint)
    try:
        if origin is typing.Literal:
            chosen = _SCALARS[type(args[0])](value)
            if chosen not in args:
                raise ValueError(f"must be one of {choice_list(args)}")
            return chosen
        if origin is tuple:
            return tuple(_SCALARS[args[0]](item) for item in _as_list(value))
        return _SCALARS[hint](value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{label}={value!r}: {e}") from None


def _as_list(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    if not isinstance(value, str):
        raise TypeError("expected a list or comma-separated values")
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list ({e})") from None
        if not isinstance(items, list):
            raise ValueError("expected a JSON list")
        return items
    return [item.strip() for item in text.split(",")] if text else []


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{value!r} is not a bool ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})")


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{value!r} is not an int")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not an int")
        return int(value)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an int") from None


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


# ---------------------------------------------------------------- errors naming the setting

class SettingError(ValueError):
    """A value a config refuses, with the setting it belongs to.

    A stage config raises it with its own field name (`max_seq_length`); a config that holds
    that one as a section re-raises it with the section's path in front (`within`), so the
    flow's error reads `setting shards.phase2.max_seq_length: ...` and the job's
    `--max_seq_length ...`: the same check, named where the user set the value."""

    def __init__(self, setting: str, message: str, template: str = "--{setting} {message}"):
        super().__init__(setting, message)
        self.setting, self.message, self.template = setting, message, template

    def __str__(self) -> str:
        return self.template.format(setting=self.setting, message=self.message)

    def within(self, prefix: str, template: str = "setting {setting}: {message}"
               ) -> SettingError:
        """The same error, for the setting at `prefix` + its path."""
        return SettingError(prefix + self.setting, self.message, template)


def check(ok: bool, setting: str, message: str) -> None:
    """Raise SettingError(setting, message) unless `ok`: the one-line form of a field check."""
    if not ok:
        raise SettingError(setting, message)


def choices(hint: Any) -> tuple | None:
    """The values a `Literal[...]` field allows (None for any other type)."""
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def choice_list(values: Sequence[Any]) -> str:
    """`a, b or c`: how errors and help list a field's choices."""
    names = [str(v) for v in values]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_choices(config: Any, template: str = "--{setting} {message}") -> None:
    """Each `Literal[...]` field of the dataclass `config` holds one of its values: the check
    of a config built in code (`apply` and the flags convert through `convert_setting`, which
    refuses the same values). Configs call it in `__post_init__`; `template` as SettingError's."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        allowed = choices(hints[f.name])
        value = getattr(config, f.name)
        if allowed is not None and value not in allowed:
            raise SettingError(f.name, f"must be one of {choice_list(allowed)}, got {value!r}",
                               template)


# ---------------------------------------------------------------- overrides of nested configs

def apply(config: Any, overrides: Mapping[str, Any], prefix: str = "",
          label: str = "setting") -> Any:
    """`config` (a frozen dataclass) with a nested mapping of overrides applied.

    Sections (dataclass fields) take a mapping; a tuple of named dataclasses (a training run's
    `phases`) takes items by name or index (`{"phase2": {"steps": 10}}`, `{"1": {...}}`); every
    other value is converted to its field's type. Each dataclass is built once, after all of
    its changes, so its checks see the final values whatever their order. An error names the
    setting by its full path as the user wrote it (`prefix` + key, `phase1` not `phases.0`),
    `label` first ("setting", "--set", "config key"). A config with a `follow_changes(changes)
    -> changes` method derives the settings left unset from those given (a shortened phase's
    warmup, training/config.py `PhaseConfig.follow_changes`).
    """
    fields = {f.name for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    changes: dict[str, Any] = {}
    items = {name: list(getattr(config, name)) for name in fields
             if _named_items(getattr(config, name))}
    for key, value in overrides.items():
        key = str(key)
        path = f"{prefix}{key}"
        owner = next((name for name, entries in items.items() if _item_index(entries, key)
                      is not None), None)
        if key not in fields and owner is None:
            raise SettingError(path, f"unknown field (known: {sorted(fields)})",
                               _template(label))
        if owner is not None and key not in fields:  # `phase2` for `phases.1`
            index = _item_index(items[owner], key)
            items[owner][index] = apply(items[owner][index], _mapping(value, path, label),
                                        f"{path}.", label)  # named as the user wrote it
            continue
        current = getattr(config, key)
        optional = _optional_section(hints[key])
        if optional is not None:  # `quality: {...}` or null: a section that may be unset
            changes[key] = None if value is None else (
                apply(current, _mapping(value, path, label), f"{path}.", label)
                if current is not None
                else build(optional, _mapping(value, path, label), f"{path}.", label))
        elif dataclasses.is_dataclass(current):
            changes[key] = apply(current, _mapping(value, path, label), f"{path}.", label)
        elif key in items and isinstance(value, Mapping):  # `phases.1.steps`
            for name, entry in _mapping(value, path, label).items():
                index = _item_index(items[key], str(name))
                if index is None:
                    names = [getattr(item, "name", i) for i, item in enumerate(items[key])]
                    raise SettingError(f"{path}.{name}", f"no such item (items: {names})",
                                       _template(label))
                items[key][index] = apply(items[key][index], _mapping(entry, f"{path}.{name}",
                                                                      label),
                                          f"{path}.{name}.", label)
        elif _item_class(hints[key]) is not None:  # a whole list: `sources: [{...}, ...]`
            changes[key] = build_items(_item_class(hints[key]), value, f"{path}.", label)
        else:
            name = _template(label).format(setting=path, message="").removesuffix(": ")
            changes[key] = convert_setting(name, value, hints[key])
    changes.update({name: tuple(entries) for name, entries in items.items()
                    if tuple(entries) != getattr(config, name)})
    follow = getattr(config, "follow_changes", None)  # settings that follow the ones given
    if follow is not None:
        changes = follow(changes)
    try:
        return dataclasses.replace(config, **changes)
    except SettingError as error:
        raise error.within(prefix, _template(label)) from None
    except ValueError as error:  # a rule over several fields: named by the section
        if not prefix:
            raise
        raise ValueError(f"{label} {prefix.rstrip('.')}: {error}") from None


def _optional_section(hint: Any) -> type | None:
    """The dataclass of a `SomeConfig | None` field, else None."""
    if typing.get_origin(hint) not in (types.UnionType, typing.Union):
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and dataclasses.is_dataclass(args[0]) else None


def _item_class(hint: Any) -> type | None:
    """The dataclass of a `tuple[SomeConfig, ...]` field, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def build_items(cls: type, value: Any, prefix: str, label: str = "setting") -> tuple:
    """A tuple field of dataclasses set whole: `value` is a list (or JSON list text) of
    mappings, each item built from its fields (`build`); an error names `prefix` + index."""
    try:
        entries = _as_list(value)
    except (TypeError, ValueError) as e:
        raise SettingError(prefix.rstrip("."), f"takes a list of mappings ({e})",
                           _template(label)) from None
    return tuple(build(cls, _mapping(entry, f"{prefix}{i}", label), f"{prefix}{i}.", label)
                 for i, entry in enumerate(entries))


def build(cls: type, values: Mapping[str, Any], prefix: str = "", label: str = "setting") -> Any:
    """A dataclass `cls` made from a mapping of its fields (required ones included), each
    value converted to its field's type; errors name the setting (`prefix` + field)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    needed = [name for name, f in fields.items()
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    unknown = [str(k) for k in values if str(k) not in fields]
    for key in unknown or [name for name in needed if name not in values][:1]:
        message = ("unknown field" if key in unknown else "is required") + \
            f" (fields: {list(fields)})"
        raise SettingError(f"{prefix}{key}", message, _template(label))
    hints = typing.get_type_hints(cls)
    required = {name: convert_setting(
        _template(label).format(setting=prefix + name, message="").removesuffix(": "),
        values[name], hints[name]) for name in needed}
    try:
        item = cls(**required)
    except SettingError as error:
        raise error.within(prefix, _template(label)) from None
    return apply(item, {k: v for k, v in values.items() if k not in required}, prefix, label)


def _template(label: str) -> str:
    """How an error names a setting: `setting a.b: ...`, `--set a.b: ...`, `--flag: ...`."""
    return f"{label}{{setting}}: {{message}}" if label.endswith("-") else \
        f"{label} {{setting}}: {{message}}"


def _named_items(value: Any) -> bool:
    return (isinstance(value, tuple) and bool(value)
            and all(dataclasses.is_dataclass(v) for v in value))


def _item_index(entries: list, key: str) -> int | None:
    """The item called `key` (its `name` field), or at index `key`; None if none is."""
    for i, entry in enumerate(entries):
        if getattr(entry, "name", None) == key:
            return i
    return int(key) if key.isdigit() and int(key) < len(entries) else None


def _mapping(value: Any, path: str, label: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise SettingError(path, f"is a section: it takes a mapping, got {value!r}",
                           _template(label))
    return value


def dotted(tree: Mapping[str, Any], prefix: str = "", items: bool = False) -> dict[str, Any]:
    """A nested mapping as `{dotted name: value}`, the names `--set` takes:
    `{"a": {"b": 1}, "c": [{"d": 2}]}` -> `{"a.b": 1, "c": [{"d": 2}]}`, and with `items` a
    list holding mappings named item by item (`"c.0.d": 2`, as MLflow's flat params want).

    An empty section names nothing. A key that is no setting name (not text, or an empty part)
    and a setting given both ways (`{"a.b": 1, "a": {"b": 2}}`) are ValueErrors naming it."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or not key or "" in key.split("."):
            raise ValueError(f"{key!r} is not a setting name")
        name = f"{prefix}{key}"
        if items and isinstance(value, (list, tuple)) and any(isinstance(v, Mapping)
                                                               for v in value):
            value = {str(i): item for i, item in enumerate(value)}
        items_of = dotted(value, f"{name}.", items) if isinstance(value, Mapping) \
            else {name: value}
        for item, item_value in items_of.items():
            if item in flat:
                raise ValueError(f"setting {item} is given twice")
            flat[item] = item_value
    return flat


def undotted(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`{dotted name: value}` -> the nested mapping `apply` takes (the inverse of `dotted`).

    A name that is a section of another (`a=1` and `a.b=2`) is a ValueError naming it."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.strip().split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(  # noqa: TRY004 (a user's text, not a type)
                    f"{key}: {part} is a setting, not a section")
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"{key} is a section, not a setting")  # noqa: TRY004
        node[leaf] = value
    return tree


def setting_at(config: Any, name: str) -> Any:
    """The value of the dotted setting `name` (`pretrain.model.init_from`) of a config, its
    sections read as attributes."""
    for part in name.split("."):
        config = getattr(config, part)
    return config


def parse_assignments(pairs: Sequence[str], label: str = "--set") -> dict[str, Any]:
    """`["pretrain.phase1.steps=20", "finetune.tasks=rte,mrpc"]` -> a nested mapping.

    Values stay text here; `apply` converts each to its field's type."""
    flat: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"{label} {pair!r}: expected key=value")
        flat[key.strip()] = raw
    try:
        return undotted(flat)
    except ValueError as e:
        raise ValueError(f"{label} {e}") from None


def load_file(path: str, yaml_loader: type | None = None) -> dict[str, Any]:
    """The nested mapping of a `.yaml`/`.yml`/`.json` settings file; `yaml_loader`: a
    `yaml.SafeLoader` subclass to read YAML with (default: SafeLoader itself)."""
    import yaml

    is_json = path.endswith(".json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f) if is_json else yaml.load(f, Loader=yaml_loader or yaml.SafeLoader)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid {'JSON' if is_json else 'YAML'} ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")  # noqa: TRY004
    return data


def merge(base: Mapping[str, Any], more: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings merged, `more` winning (a file's settings, then `--set`s). A mapping
    onto a list of mappings (a file's `decays` or `data.sources`) changes the items it names,
    by `name` or index, as `apply` does a config's (`--set decays.general.steps=2`); `prefix`
    is `base`'s path, for the error naming an item there is not."""
    merged = dict(base)
    for key, value in more.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = merge(current, value, f"{prefix}{key}.")
        elif isinstance(value, Mapping) and isinstance(current, (list, tuple)) and current \
                and all(isinstance(item, Mapping) for item in current):
            merged[key] = _merge_items(f"{prefix}{key}", list(current), value)
        else:
            merged[key] = value
    return merged


def _merge_items(path: str, items: list[Mapping], more: Mapping[str, Any]) -> list:
    names = [item.get("name") for item in items]
    for name, value in more.items():
        name = str(name)
        index = names.index(name) if name in names else (
            int(name) if name.isdigit() and int(name) < len(items) else None)
        if index is None:
            raise SettingError(f"{path}.{name}", f"no such item (items: {names})",
                               "setting {setting}: {message}")
        items[index] = merge(items[index], value, f"{path}.{name}.") \
            if isinstance(value, Mapping) else value
    return items


# ---------------------------------------------------------------- command-line flags

def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), from the class source."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def add_config_flags(parser: argparse.ArgumentParser, cls: type,
                     skip: Sequence[str] = ()) -> None:
    """A `--<field>` flag per field of the config dataclass `cls`, help from its docstring.

    Flags default to "not given" (None), so the config's own default (or a preset's) holds
    unless the flag is given; `config_from_flags` converts each given value with
    `convert_setting`. A bool flag alone means true (`--pack`), or takes a value
    (`--pack=false`); a `Literal[...]` flag shows its choices (`{fp32,bf16}`)."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = hints[f.name]
        help_text = docs.get(f.name, "").replace("%", "%%")
        if _is_bool(kind):
            parser.add_argument(f"--{f.name}", nargs="?", const="true", default=None,
                                metavar="BOOL", help=help_text)
        elif choices(kind) is not None:
            parser.add_argument(f"--{f.name}", default=None, help=help_text,
                                metavar="{" + ",".join(map(str, choices(kind))) + "}")
        else:
            parser.add_argument(f"--{f.name}", default=None, help=help_text)


def config_from_flags(config: Any, args: argparse.Namespace) -> Any:
    """`config` with the flags given (not None) of `add_config_flags` applied, as `--flag`."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(config)
             if getattr(args, f.name, None) is not None}
    return apply(config, given, label="--")


def _is_bool(hint: Any) -> bool:
    return hint is bool or (typing.get_origin(hint) in (types.UnionType, typing.Union)
                            and bool in typing.get_args(hint))



def settings_help(config: Any, one_line: bool = False, prefix: str = "") -> list[str]:
    """Help lines for every setting of `config` (a dataclass), as `--set` names them:
    `name = default` and its docstring (`field_docs`), the full text wrapped below or, with
    `one_line`, its first sentence beside it. Sections (nested dataclasses) get a header line
    and their settings indented; a tuple of named items (a run's `phases`) lists each item by
    name (`phase1.steps`)."""
    import textwrap

    docs = field_docs(type(config))
    lines: list[str] = []
    after_section = False  # the items that follow a section start after a blank line too
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            lines += ["", f"{prefix}{f.name}:"]
            lines += [("  " + line).rstrip()
                      for line in settings_help(value, one_line, f"{prefix}{f.name}.")]
            after_section = True
            continue
        if _named_items(value):
            lines += [""] if after_section else []
            for i, item in enumerate(value):
                name = getattr(item, "name", i)
                lines += settings_help(item, one_line, f"{prefix}{f.name}.{name}."
                                       if isinstance(name, int) else f"{prefix}{name}.")
            after_section = False
            continue
        after_section = False
        doc = docs.get(f.name, "")
        head = f"{prefix}{f.name} = {value!r}"
        if one_line:
            sentence = re.split(r"\.\s+(?=[A-Z`\"(])", doc)[0].rstrip(".")
            lines.append(f"{head}  ({sentence})" if sentence else head)
        else:
            lines.append(head)
            lines += textwrap.wrap(doc, width=88, initial_indent="    ",
                                   subsequent_indent="    ")
    return lines
