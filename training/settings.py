"""Typed `key=value` settings: one converter for every `--set` in the project.

`bert-pretrain --set learning_rate=1e-4` and the flow's `--set finetune.seeds=1,2` (or a
deployment's JSON parameters) both arrive as text or JSON values; each is converted to the
dataclass field's declared type, and a value that does not fit is an error naming the setting
and the value, before anything runs.
"""
from __future__ import annotations

import json
import math
import types
import typing
from typing import Any

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def convert_setting(label: str, value: Any, hint: Any) -> Any:
    """`value` (a `--set` string or a JSON value) as the field's declared type.

    Tuples take a JSON list or a comma-separated string; bools take true/false/1/0/yes/no.
    A value that does not fit is a ValueError starting `{label}={value!r}: `.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # `str | None`: None means "not set yet"
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return convert_setting(label, value, hint)
    try:
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
