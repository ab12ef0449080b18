"""A full disk in a Beam run, found wherever Beam puts it, and reported in one line.

A worker's error reaches the runner as text when the worker is another process (Beam's Fn
API sends `ProcessBundleResponse.error`, a formatted traceback, and the runner raises
`RuntimeError(that text)`), so the ENOSPC of a multi-processing run is found in the text:
our DiskFullError's line (its path), else Python's `[Errno 28] <strerror>: '<path>'` (pyarrow
writes `[errno 28]`). In-process, Beam re-raises it as a RuntimeError whose context is the
original error, which `common.errors.disk_full` finds.

A job wraps its pipeline run in `disk_full_reported`; `pipelines/beam_worker.py` and the job's
log handlers (`DISK_FULL_LOG_FILTER`) drop the worker tracebacks of a full disk, which the
job's one-line error says.
"""
from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from common.errors import DISK_FULL_ERRNOS, DiskFullError, disk_full

_DISK_FULL_LINE = re.compile(
    r"DiskFullError: no space left on the device writing (?P<path>.+?)"
    r"(?:: it needs (?P<needed>[\d.]+ [KMGT]?B))?(?:[:,] [\d.]+ [KMGT]?B left there)?"
    r"(?: \[while running '[^\n]*'\])*$", re.MULTILINE)
_ERRNO_TEXT = re.compile(r"\[errno (?P<errno>\d+)\][^:'\n]*(?:: '(?P<path>[^'\n]+)')?",
                         re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def beam_disk_full(error: BaseException, path: str | None = None) -> DiskFullError | None:
    """`error` (anything a Beam run raises) as a DiskFullError naming the file being written
    when a full disk (ENOSPC, EDQUOT) caused it, else None. `path`: where the job writes, named
    when the error does not say which file."""
    found = disk_full(error)
    if found is not None:
        return found if found.path != "its output" or path is None else DiskFullError(path)
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = disk_full_in_text(str(error), path)
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def disk_full_in_text(text: str, path: str | None = None) -> DiskFullError | None:
    """The DiskFullError a traceback or error message `text` tells of, else None."""
    match = _DISK_FULL_LINE.search(text)
    if match:
        needed = match.group("needed")
        number, unit = needed.split() if needed else (None, None)
        return DiskFullError(match.group("path"),
                             int(float(number) * _UNITS[unit]) if number else None)
    for match in _ERRNO_TEXT.finditer(text):
        if int(match.group("errno")) in DISK_FULL_ERRNOS:
            return DiskFullError(match.group("path") or path or "its output")
    return None


@contextlib.contextmanager
def disk_full_reported(output: str) -> Iterator[None]:
    """Around a pipeline run: a full disk in any of its writes (ours, Beam's sinks, in a worker
    process or not) is raised as one DiskFullError naming the file (else `output`), so the job
    and the flow that runs it report one line; the job writes no manifest after it."""
    try:
        yield
    except Exception as e:
        full = None if isinstance(e, DiskFullError) else beam_disk_full(e, output)
        if full is None:
            raise
        raise full from None


class DiskFullLogFilter(logging.Filter):
    """Drops Beam's ERROR records of a full disk (a worker's traceback, logged once by the
    worker and once more by the runner): the job's one-line error says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith("apache_beam"):
            return True
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += "\n" + str(record.exc_info[1])
        return disk_full_in_text(text, None) is None


DISK_FULL_LOG_FILTER = DiskFullLogFilter()
