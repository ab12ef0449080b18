"""Launching the training job as a subprocess: it dies with the flow process, its whole process
group stops when the flow run is cancelled, and it gets a clean rendezvous environment."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

from common import logs
from flows import stages

# Runs in the child before the real command: ask Linux for SIGTERM when the flow process dies
# (even by SIGKILL), then exec the command. Done by exec rather than `preexec_fn`, which is
# unsafe in the threads Prefect runs tasks in.
EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "try:\n    ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM)\n"
    "except OSError:\n    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")


def _accelerator() -> str:
    """DS_ACCELERATOR for the trainers: the caller's setting, else what torch finds here (a
    fixed "cpu" would put a GPU machine's ranks on the CPU with gloo)."""
    if "DS_ACCELERATOR" in os.environ:
        return os.environ["DS_ACCELERATOR"]
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_subprocess(command: list[str], log: Callable[[str], None] = print,
                   env: dict[str, str] | None = None) -> None:
    """Run `command`, streaming its output to `log`; stop its whole process group on cancel."""
    log("$ " + " ".join(command))
    # A launched training job makes its own rendezvous: a RANK or MASTER_PORT left in this
    # process's environment (by an in-process run, say) would send it to a port in use.
    inherited = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARIABLES}
    # `log` stamps each line's time: the job's own log lines leave theirs out
    env = {**inherited, "DS_ACCELERATOR": _accelerator(), "PYTHONUNBUFFERED": "1",
           logs.RELAYED: "1", **(env or {})}
    # The stage's build lock goes with it: its folder stays locked while the job writes to it,
    # even if this process is killed first.
    proc = subprocess.Popen([sys.executable, "-c", EXEC_WITH_PDEATHSIG, *command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, pass_fds=stages.held_lock_fds())
    previous = signal.getsignal(signal.SIGTERM) if _main_thread() else None
    if _main_thread():
        # Prefect cancels a flow run by terminating its process: take the trainers down too.
        signal.signal(signal.SIGTERM, lambda *_: (_stop(proc), sys.exit(143)))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():  # a progress bar's carriage return reads as an empty line
                log(line.rstrip())
        code = proc.wait()
    finally:
        _stop(proc)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code != 0:
        raise RuntimeError(f"{command[0]} exited with status {code}")


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
