"""What a user did wrong, told in one line; what a job set aside, counted, never lost.

Every entry point (the Beam jobs, `bert-pretrain`, `bert-finetune`, `bert-dag`) reports a user
error (`is_user_error`) as `<command>: error: <message>` without a traceback, and writes a
record it cannot use as a `BadRecord` to `<output>/dead_letter/`. No Beam, no torch.
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
from dataclasses import dataclass
from typing import NoReturn

DEAD_LETTER_DIR = "dead_letter"


@dataclass(frozen=True)
class BadRecord:
    """A record a job set aside: written to `<output>/dead_letter/` and counted, never lost."""
    file: str
    record: str  # e.g. "page 12345", "line 7", "stream at byte 5512"
    reason: str

    def to_json(self) -> str:
        import json
        return json.dumps({"file": self.file, "record": self.record, "reason": self.reason},
                          ensure_ascii=False)


class NoOutputError(ValueError):
    """The job ran but its whole input gave nothing (0 documents, 0 instances): it fails, and
    writes no manifest, so no later stage takes an empty folder for a finished one. A
    ValueError: the input's values are what is wrong."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """No space left where a stage writes: one line naming the path being written, with the
    space it needed (where known) and what the device has left. An OSError, so a caller that
    cleans up on OSError still does."""

    def __init__(self, path: str, needed: int | None = None):
        self.path, self.needed = path, needed
        left = free_bytes(path)
        message = f"no space left on the device writing {path}"
        if needed is not None:
            message += f": it needs {human_bytes(needed)}"
        if left is not None:
            message += f"{',' if needed is not None else ':'} {human_bytes(left)} left there"
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # across processes (Beam workers, Prefect results) as it was raised
        return DiskFullError, (self.path, self.needed)


def free_bytes(path: str) -> int | None:
    """Free bytes on the filesystem holding `path` (its nearest existing folder); None for a
    remote path or where the system cannot tell."""
    if "://" in path and not path.startswith("file://"):
        return None
    folder = os.path.abspath(path)
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def human_bytes(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def disk_full(error: BaseException, path: str | None = None,
              needed: int | None = None) -> DiskFullError | None:
    """`error` as a DiskFullError when it, or an error it was raised from or while handling, is
    ENOSPC or EDQUOT (a library's write deep in torch, Beam or DeepSpeed); None otherwise. The
    path is the one given, else the failing call's own filename, else "its output"."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFullError):
            return error
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return DiskFullError(path or error.filename or "its output", needed)
        error = error.__cause__ or error.__context__
    return None


USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError, NoOutputError, DiskFullError)
"""What a user's options or inputs cause: reported in one line, not as a traceback."""
DEBUG_ENV = "BERT_DEBUG"
OUR_PACKAGES = ("common", "pipelines", "training", "model", "finetune", "flows", "peers")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def exit_with_error(prog: str, message: str) -> NoReturn:
    """`<prog>: error: <message>` on stderr, exit 2: argparse's `parser.error` without the
    usage it prints first, whose lines of flags would hide the one that names the setting."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def is_user_error(error: BaseException, kinds: tuple[type[BaseException], ...] = USER_ERRORS
                  ) -> bool:
    """Whether `error` is one of our checks speaking to the user: one of `kinds` raised by
    this project's code (its innermost frame in one of OUR_PACKAGES). The same types raised
    inside torch, DeepSpeed or Beam are bugs (ours or theirs) and keep their traceback."""
    if not isinstance(error, kinds):
        return False
    tb = error.__traceback__
    if tb is None or isinstance(error, (NoOutputError, DiskFullError)):
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return is_our_file(tb.tb_frame.f_code.co_filename)


def is_our_file(path: str) -> bool:
    """Whether a source file belongs to this project's packages (not a library's)."""
    path = os.path.abspath(path)
    return any(path.startswith(os.path.join(_REPO, package) + os.sep) for package in OUR_PACKAGES)
