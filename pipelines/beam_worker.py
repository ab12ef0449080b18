"""A Beam worker process that ends with the process that started it.

    python -m pipelines.beam_worker <parent pid>

Beam's local runner in multi-processing mode (`--direct_running_mode=multi_processing`) starts
each worker as `sh -c "<command>"` from a thread that waits on it for the worker's whole life;
its own command, `python -m apache_beam.runners.worker.sdk_worker_main`, keeps running (~165 MB
each, until its gRPC channel times out) when the job, or the flow that runs the job in-process,
is killed with SIGKILL. This module asks Linux to SIGKILL the worker when that thread's process
dies (prctl PR_SET_PDEATHSIG), checks that the parent is still the one that started it (it may
have died before the request), then runs Beam's worker as it is. `jobs.local_runner` hands the
command to the runner (`environment`).

Beam's worker also prints the traceback of a failed bundle to its stderr (the job's), besides
sending it to the runner: the one of a full disk is left out there (`QuietDiskFullStderr`), as
the job reports that in one line (`disk_full.disk_full_reported`); BERT_DEBUG=1 keeps it.
"""
from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def command(parent_pid: int | None = None) -> str:
    """The shell command of a worker whose parent is `parent_pid` (default: this process). The
    `exec` makes the worker the shell's own process, so its parent is the runner's process."""
    parent = os.getpid() if parent_pid is None else parent_pid
    return f"exec {shlex.quote(sys.executable)} -m pipelines.beam_worker {parent}"


def environment():
    """The Beam environment (a subprocess per worker) that starts workers with `command`."""
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    return SubprocessSDKEnvironment.from_command_string(command())


def die_with_parent(parent_pid: int, prog: str = "beam_worker") -> None:
    """SIGKILL this process when its parent dies; exit now if `parent_pid` has died already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the worker ends when its gRPC channel to the runner times out
    if os.getppid() != parent_pid:
        sys.exit(f"{prog}: the process {parent_pid} that started it has ended; not starting")


class QuietDiskFullStderr:
    """A text stream that passes on all it is given, except a traceback of a full disk (with
    the newline `print` writes after it)."""

    def __init__(self, stream):
        self.stream = stream
        self.dropped = False

    def write(self, text: str) -> int:
        from pipelines.disk_full import disk_full_in_text

        if text.startswith("Traceback") and disk_full_in_text(text) is not None:
            self.dropped = True
            return len(text)
        if self.dropped and text == "\n":
            self.dropped = False
            return len(text)
        self.dropped = False
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main(argv: list[str]) -> None:
    from common.errors import debug_requested

    die_with_parent(int(argv[1]))
    if not debug_requested():
        sys.stderr = QuietDiskFullStderr(sys.stderr)
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(argv)


if __name__ == "__main__":
    main(sys.argv)
