"""What a user did wrong, told in one line; what a job set aside, counted, never lost.

Every entry point (the Beam jobs, `bert-pretrain`, `bert-finetune`, `bert-dag`) reports a user
error (`is_user_error`) as `<command>: error: <message>` without a traceback, and writes a
record it cannot use as a `BadRecord` to `<output>/dead_letter/`. No Beam, no torch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

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


USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError, NoOutputError)
"""What a user's options or inputs cause: reported in one line, not as a traceback."""
DEBUG_ENV = "BERT_DEBUG"
OUR_PACKAGES = ("common", "pipelines", "training", "model", "finetune", "flows", "peers")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def is_user_error(error: BaseException, kinds: tuple[type[BaseException], ...] = USER_ERRORS
                  ) -> bool:
    """Whether `error` is one of our checks speaking to the user: one of `kinds` raised by
    this project's code (its innermost frame in one of OUR_PACKAGES). The same types raised
    inside torch, DeepSpeed or Beam are bugs (ours or theirs) and keep their traceback."""
    if not isinstance(error, kinds):
        return False
    tb = error.__traceback__
    if tb is None or isinstance(error, NoOutputError):
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return is_our_file(tb.tb_frame.f_code.co_filename)


def is_our_file(path: str) -> bool:
    """Whether a source file belongs to this project's packages (not a library's)."""
    path = os.path.abspath(path)
    return any(path.startswith(os.path.join(_REPO, package) + os.sep) for package in OUR_PACKAGES)
