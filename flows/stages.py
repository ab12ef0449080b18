"""Content-addressed stage outputs: the mechanism that lets a re-run skip finished work.

A stage's output folder is `<root>/<stage>-<hash>`, the hash taken over the stage's resolved
config and the hashes of the stages it reads. A folder with a `manifest.json` is complete (every
job writes its manifest last, atomically), so a re-run with the same config reuses it, and a
changed config or upstream output gets a new folder: two configs never mix.

Two runs that need the same stage at once (a `data-large` run still building the shards that a
`large` run started beside it also needs) must not build it into one folder together: the
builder holds a lock on a file in the folder (`building`), and the other run waits for the
manifest. A run that dies lets go of its lock with its processes.

Within `looking_up()` no stage builds: `run_stage` returns the folder a run would use and whether
it is built (`bert-dag --plan` reads the stages a run would reuse, by their keys); nothing
remote is listed or read then, so a stage under a gs:// root or over gs:// inputs is not found.
"""
from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from common import storage

logger = logging.getLogger("flows")

LOCK_NAME = storage.STAGE_LOCK_NAME


@dataclass(frozen=True)
class StageResult:
    """What a stage hands downstream: where its output is and what it was made from."""
    stage: str
    path: str
    config_hash: str
    cached: bool
    seconds: float
    manifest: dict = field(default_factory=dict, compare=False, repr=False)


_LOOKING_UP = contextvars.ContextVar("looking_up", default=False)


@contextlib.contextmanager
def looking_up() -> Iterator[None]:
    """Within: `run_stage` builds nothing, locks nothing and makes no folder; it returns the
    stage's folder, `cached` saying whether it is built (its manifest, else {})."""
    token = _LOOKING_UP.set(True)
    try:
        yield
    finally:
        _LOOKING_UP.reset(token)


def is_looking_up() -> bool:
    return _LOOKING_UP.get()


def stage_dir(root: str, stage: str, config: dict[str, Any],
              upstream: tuple[StageResult, ...] = ()) -> tuple[str, str]:
    key = {"stage": stage, "config": config, "upstream": [u.config_hash for u in upstream]}
    digest = storage.config_hash(key)
    return storage.join(root, f"{stage}-{digest}"), digest


def run_stage(root: str, stage: str, config: dict[str, Any], build: Callable[[str], dict | None],
              upstream: tuple[StageResult, ...] = (), poll_seconds: float = 10.0) -> StageResult:
    """Reuse `<root>/<stage>-<hash>` if complete, else call `build(path)` to make it.

    `build` must leave `manifest.json` in `path` when (and only when) it succeeded; it may find
    a partial previous attempt there (pre-training resumes from its last checkpoint). While
    another live run builds the same folder, this one waits for it (looking every
    `poll_seconds`) and reuses its output, or builds it if that run failed.
    """
    path, digest = stage_dir(root, stage, config, upstream)
    if _LOOKING_UP.get():  # a remote root is not read: a plan makes no cloud calls
        manifest = None if storage.is_remote(root) else storage.read_manifest(path)
        return StageResult(stage, path, digest, cached=manifest is not None, seconds=0.0,
                           manifest=manifest or {})
    manifest = storage.read_manifest(path)
    if manifest is None:
        storage.makedirs(path)
        with building(path, stage, poll_seconds):
            manifest = storage.read_manifest(path)  # finished by the run we waited for?
            if manifest is None:
                started = time.monotonic()
                build(path)
                manifest = storage.read_manifest(path)
                if manifest is None:
                    raise RuntimeError(
                        f"stage {stage!r} finished without writing {path}/manifest.json")
                return StageResult(stage, path, digest, cached=False,
                                   seconds=time.monotonic() - started, manifest=manifest)
    # a reused stage's one line: the builds it skips would otherwise leave it silent
    logger.info("%s: reused %s", stage, path)
    return StageResult(stage, path, digest, cached=True, seconds=0.0, manifest=manifest)


@contextlib.contextmanager
def building(path: str, stage: str, poll_seconds: float = 10.0) -> Iterator[None]:
    """Hold `path`'s build lock for the block, waiting while another run holds it.

    An advisory `flock` on `<path>/.build.lock`: the kernel lets go of it when the last process
    holding it ends, however it ends (kill -9 too), so there is no lease to expire and no clock
    or pid to compare. A stage's subprocess (the trainers' launcher) inherits it
    (`held_lock_fds`), so a flow run killed mid-training keeps its stage locked until its
    trainers are down. It excludes the processes and threads of one machine, and the machines
    sharing a volume whose client forwards flock to the server (NFS with working lock service);
    a FUSE mount may lock per node only, and NFSv3 frees a lost node's lock only when that node
    recovers. Object-store roots (gs://) have no lock (see the README).
    """
    if poll_seconds <= 0:
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds}")
    if storage.is_remote(path):
        yield
        return
    lock_path = storage.join(path, LOCK_NAME)
    with open(lock_path, "a+", encoding="utf-8") as lock:
        _wait_for_lock(lock, stage, path, poll_seconds)
        _describe_holder(lock, stage)
        held = held_lock_fds()
        _HELD.fds = (*held, lock.fileno())
        try:
            yield
        finally:
            _HELD.fds = held  # closing the file then releases the lock


_HELD = threading.local()
STILL_WAITING_SECONDS = 300.0
"""How often a waiting run says it still waits (the holder may build for hours)."""


_SHUTTING_DOWN = threading.Event()
"""Set when the interpreter exits (Ctrl-C in the flow's main thread): a waiting run stops.

Python joins the threads of thread pools (Prefect's task runner) before it marks the main
thread stopped, in `threading`'s exit hooks, so a waiting thread would otherwise hold the
process until the other run's build ends. A hook registered after `concurrent.futures`' runs
before its join. (`_register_atexit` is CPython's, 3.9 on; without it runs just wait.)"""
getattr(threading, "_register_atexit", lambda hook: None)(_SHUTTING_DOWN.set)


def held_lock_fds() -> tuple[int, ...]:
    """The build locks this thread holds, for the subprocesses its stage starts to inherit."""
    return getattr(_HELD, "fds", ())


def _wait_for_lock(lock, stage: str, path: str, poll_seconds: float) -> None:
    started = time.monotonic()
    said = None
    while not _try_lock(lock):
        waited = time.monotonic() - started
        if said is None or waited - said >= STILL_WAITING_SECONDS:
            logger.info("%s: another run is building %s (%s); waiting for it%s", stage, path,
                        _holder(lock.name), f" ({waited / 60:.0f} min so far)" if said else "")
            said = waited
        if _SHUTTING_DOWN.wait(poll_seconds):
            raise RuntimeError(f"{stage}: stopped waiting for {path}: shutting down")


def _try_lock(lock) -> bool:
    """True once held, False while another holds it. A filesystem without flock (NFSv3
    without its lock service: ENOLCK) runs unlocked, with a warning: a run must not fail for
    want of a courtesy."""
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        logger.warning("%s: no file locks here (%s); a run started beside this one would "
                       "build the stage again", lock.name, error.strerror)
    return True


def _describe_holder(lock, stage: str) -> None:
    """Who holds the lock, for the log line of the runs that wait (information only)."""
    lock.seek(0)
    lock.truncate()
    lock.write(f"stage {stage}, host {socket.gethostname()}, pid {os.getpid()}, since "
               f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
    lock.flush()


def _holder(lock_path: str) -> str:
    with contextlib.suppress(OSError), open(lock_path, encoding="utf-8", errors="replace") as f:
        return f.read().strip() or "holder unknown"
    return "holder unknown"
