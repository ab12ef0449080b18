"""Which extra each command needs, and the one line it prints when that extra is missing.

pyproject.toml's core dependencies are what `common` imports; each subsystem's packages are an
extra: `data` (the Beam jobs), `train` (the model, pre-training, fine-tuning), `flow` (the
Prefect DAG, with `data` and `train`). A command whose extra is not installed ends, before it
imports its subsystem, with

    bert-dag: needs the flow extra: pip install '.[flow]'

and exit code 1; a module of another extra missing later in the run (the contamination
audit's command reads the evaluation sets with finetune's readers: torch) names that module's
extra the same way. No third-party import here: it runs before them.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator
from typing import TypeVar

EXTRAS: dict[str, tuple[str, ...]] = {
    "data": ("apache_beam", "pyarrow", "blingfire", "py3langid", "psutil"),
    "train": ("torch", "deepspeed", "transformers", "safetensors", "webdataset", "pyarrow",
              "sklearn", "scipy", "seqeval", "matplotlib", "tensorboard"),
    "flow": ("prefect", "fastapi"),
}
"""The top-level modules of each subsystem extra's own requirements (pyproject.toml; the test
tests/common/test_extras.py holds the two lists together)."""

INCLUDES: dict[str, tuple[str, ...]] = {"flow": ("data", "train")}
"""The extras an extra installs with it (`flow = ["bert-dag[data,train]", ...]`)."""

COMMANDS: dict[str, str] = {
    "beam": "data",
    "bert-pretrain": "train",
    "bert-finetune": "train",
    "bert-glue": "train",
    "bert-features": "train",
    "bert-dag": "flow",
}
"""The extra each console script ([project.scripts]) needs."""

F = TypeVar("F", bound=Callable)


def modules(extra: str) -> tuple[str, ...]:
    """The modules `extra` makes importable, those of the extras it includes too."""
    found = [m for included in INCLUDES.get(extra, ()) for m in modules(included)]
    return tuple(dict.fromkeys([*found, *EXTRAS[extra]]))


def message(command: str, extra: str) -> str:
    return f"{command}: needs the {extra} extra: pip install '.[{extra}]'"


def importable(module: str) -> bool:
    """Whether `module` (a top-level name) would import, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # an import hook refusing it, None in sys.modules
        return False


def missing(command: str) -> str | None:
    """The one line for `command` if a module of its extra is not installed, else None."""
    extra = COMMANDS[command]
    if all(importable(m) for m in modules(extra)):
        return None
    return message(command, extra)


def extra_of(command: str, module: str) -> str | None:
    """The extra that installs top-level `module`: the command's own when it does, else the
    first that does; None for a module no extra lists."""
    own = COMMANDS[command]
    if module in modules(own):
        return own
    return next((extra for extra, listed in EXTRAS.items() if module in listed), None)


@contextlib.contextmanager
def needed_by(command: str) -> Iterator[None]:
    """Around a command module's subsystem imports: first checks the command's extra, then
    turns a ModuleNotFoundError for a module an extra installs into the one line
    (SystemExit, exit code 1). Any other error passes."""
    line = missing(command)
    if line:
        raise SystemExit(line)
    try:
        yield
    except ModuleNotFoundError as e:
        extra = extra_of(command, (e.name or "").split(".")[0])
        if extra is None:
            raise
        raise SystemExit(message(command, extra)) from e


def reports_missing(command: str) -> Callable[[F], F]:
    """A command's `main`: a module of an extra missing during the run (a lazy import) ends in
    the one line naming the extra instead of a traceback."""
    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args, **kwargs):
            with needed_by(command):
                return main(*args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap
