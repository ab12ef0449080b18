"""Logs a person reads: one logging set-up for every entry point, and one progress bar helper.

Every command (`bert-dag`, `make demo`, `bert-pretrain`, `bert-finetune`, `bert-features`, the
Beam jobs) calls `setup(verbose)` once. By default our own loggers speak at INFO and the
libraries' (HTTP clients, matplotlib, Beam, DeepSpeed, torch.distributed, Prefect's client) at
WARNING: no transport lines, no font-cache lines, no Beam INFO, and on the console no Prefect
"Finished in state Completed()" line per task (`CompletedStates`). Config dumps are DEBUG lines
(each stage saves its resolved config in its output folder anyway).

    BERT_LOG_LEVEL=DEBUG   our DEBUG lines (config dumps) and the libraries' INFO lines
    BERT_LOG_LEVEL=INFO    the default
    BERT_LOG_LEVEL=WARNING only warnings and errors, ours included

`--verbose` on a command is BERT_LOG_LEVEL=DEBUG. `setup` writes the level it settles on back to
the environment, so the stages a command starts as subprocesses (the trainers under
`torchrun`/`deepspeed`) log at the same level.

`progress(...)` is tqdm with one rule: on a terminal it redraws in place; anywhere else (a
captured run, CI, a flow's subprocess) a redraw is a new line, so it draws once a minute
(`QUIET_INTERVAL_S`), plus its first and last line, each a whole line (no log line runs into it).
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import typing
import weakref
from collections.abc import Iterator
from typing import IO, Any

ENV = "BERT_LOG_LEVEL"
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
          "ERROR": logging.ERROR}
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RELAYED = "BERT_LOG_RELAYED"
"""Set (to 1) by a process that relays a subprocess's lines through its own logger, which
stamps the time: the subprocess then leaves the time out (`RELAYED_FORMAT`)."""
RELAYED_FORMAT = "%(levelname)s %(name)s: %(message)s"

LIBRARY_LOGGERS = (
    "httpx", "httpcore", "urllib3", "requests", "matplotlib", "PIL", "apache_beam", "absl",
    "deepspeed", "DeepSpeed", "torch.distributed", "torch._dynamo", "torch._inductor",
    "prefect.client", "prefect.events", "prefect._internal", "fsspec", "gcsfs", "google",
    "asyncio", "filelock", "datasets", "transformers", "aiosqlite", "alembic", "docket",
)
"""Loggers of libraries: WARNING by default, INFO with BERT_LOG_LEVEL=DEBUG."""

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
"""Prefect's loggers of a flow's and its tasks' own lines (ours): they follow our level."""

QUIET_INTERVAL_S = 60.0
"""Seconds between a progress bar's lines where it cannot redraw in place (not a terminal)."""


def level() -> int:
    """The level BERT_LOG_LEVEL names (default INFO); an unknown name warns once, gives INFO."""
    name = os.environ.get(ENV, "").strip().upper()
    if not name:
        return logging.INFO
    if name not in LEVELS:
        logging.getLogger("common.logs").warning(
            "%s=%s: not a level (use %s); logging at INFO", ENV, os.environ[ENV], "/".join(LEVELS))
        os.environ[ENV] = "INFO"
        return logging.INFO
    return LEVELS[name]


def verbose() -> bool:
    """Whether the libraries' own INFO lines and our config dumps are wanted."""
    return level() <= logging.DEBUG


def setup(verbose_flag: bool = False, force: bool = False) -> int:
    """Set up logging for this process and the subprocesses it starts; returns our level.

    Our loggers log at BERT_LOG_LEVEL (DEBUG with `verbose_flag`), the libraries' at WARNING
    (INFO when verbose). A root logger that has handlers keeps them unless `force` (the Beam
    jobs: Beam logs a root warning at import, which installs Python's bare handler). Prefect's
    console handler is kept even then: inside a flow, a job's `run()` keeps the flow's format.
    Safe to call again."""
    if verbose_flag:
        os.environ[ENV] = "DEBUG"
    ours = level()
    os.environ.setdefault(ENV, logging.getLevelName(ours))
    root = logging.getLogger()
    for handler in root.handlers:  # one left writing to a stream since closed writes nowhere
        if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
            handler.setStream(sys.stderr)
    # A flow's console handler writes to this process's stderr or stdout; one bound to another
    # stream is left over (an earlier in-process flow), not this run's.
    in_flow = any(type(h).__name__ == "PrefectConsoleHandler"
                  and getattr(h, "stream", None) in (sys.stderr, sys.stdout)
                  for h in root.handlers)
    logging.basicConfig(level=ours, format=RELAYED_FORMAT if os.environ.get(RELAYED) else FORMAT,
                        force=force and not in_flow)
    root.setLevel(ours)
    libraries = logging.INFO if ours <= logging.DEBUG else max(ours, logging.WARNING)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(libraries)
    for name in RUN_LOGGERS:
        logging.getLogger(name).setLevel(ours)
    for handler in root.handlers:
        if type(handler).__name__ == "PrefectConsoleHandler":
            _quiet_completed_states(handler, quiet=ours > logging.DEBUG)
    quiet_library_bars()
    return ours


class CompletedStates(logging.Filter):
    """Holds back Prefect's "Finished in state Completed()" line of each task and of the flow:
    a run's report says which stages ran and which were reused, and a reused stage has its
    own line (flows/stages.py). A failed or crashed state still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name in RUN_LOGGERS and record.levelno == logging.INFO
                    and record.getMessage().startswith("Finished in state Completed("))


def _quiet_completed_states(handler: logging.Handler, quiet: bool) -> None:
    """On Prefect's console handler only: its API handler still sends the lines to the UI."""
    ours = [f for f in handler.filters if isinstance(f, CompletedStates)]
    if quiet and not ours:
        handler.addFilter(CompletedStates())
    for f in ([] if quiet else ours):
        handler.removeFilter(f)


@contextlib.contextmanager
def quiet_output() -> Iterator[None]:
    """Hold back what a library call prints itself (DeepSpeed's checkpoint conversion and op
    builds print, not log) unless verbose; a call that fails shows it after all."""
    if verbose():
        yield
        return
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held), contextlib.redirect_stderr(held):
            yield
    except BaseException:
        sys.stderr.write(held.getvalue())
        raise


def quiet_library_bars() -> None:
    """No Hugging Face loading bars (a bar per weight file load, seconds long) unless verbose."""
    if verbose():
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read at their import
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def add_verbose_flag(parser: Any) -> None:
    """`--verbose` on an argparse parser, as every command spells it."""
    parser.add_argument("--verbose", action="store_true",
                        help=f"the libraries' log lines and the config dumps too "
                             f"(same as {ENV}=DEBUG)")


def interactive(stream: IO | None = None) -> bool:
    """Whether `stream` (default stderr) is a terminal, where a bar can redraw in place."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


def progress(iterable: Any = None, **kwargs: Any) -> Any:
    """A tqdm bar (same arguments) on stderr: redrawn in place on a terminal; elsewhere a line
    every QUIET_INTERVAL_S seconds, its postfix changes waiting for the next one."""
    from tqdm import tqdm

    kwargs.setdefault("file", sys.stderr)
    if interactive(kwargs["file"]):
        return tqdm(iterable, **kwargs)
    kwargs.update(mininterval=QUIET_INTERVAL_S, dynamic_ncols=False)
    return _quiet_bar()(iterable, **kwargs)


@functools.cache
def _quiet_bar() -> type:
    from tqdm import tqdm

    class QuietBar(tqdm):
        """A bar whose postfix and description changes do not each print a line."""

        # tqdm's monitor thread redraws a bar idle for `maxinterval` without moving its last
        # draw's time, so the next update draws again: two lines where one is meant. Its own
        # instance set keeps a monitor that plain bars started elsewhere away from these.
        monitor_interval = 0
        monitor = None
        _instances: typing.ClassVar[weakref.WeakSet] = weakref.WeakSet()

        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            super().set_postfix(ordered_dict, refresh=False, **kwargs)

        def set_description(self, desc=None, refresh=True):
            super().set_description(desc, refresh=False)

        def clear(self, nolock=False):
            pass  # a drawn line stays drawn: there is nothing to wipe where nothing redraws

        def display(self, msg=None, pos=None):
            # Each draw a whole line: nothing here returns the cursor, so a carriage return
            # would leave the line open for the next log line (or draw) to run into.
            text = self.__str__() if msg is None else msg
            if text:
                self.fp.write(text + "\n")
                self.fp.flush()
            return True

        def close(self):
            if not hasattr(self, "fp"):  # a disabled bar, or one whose set-up failed
                return super().close()
            # tqdm ends its last draw with a newline of its own (the draw has one already),
            # or clears a bar it does not leave with a carriage return (nothing to clear here)
            fp, self.fp = self.fp, _DropBareNewline(self.fp)
            try:
                super().close()
            finally:
                self.fp = fp

    return QuietBar


class _DropBareNewline:
    """A stream that passes on every write but a lone newline or carriage return."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> None:
        if text not in ("\n", "\r"):
            self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
