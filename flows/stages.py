"""Content-addressed stage outputs: the mechanism that lets a re-run skip finished work.

A stage's output folder is `<root>/<stage>-<hash>`, the hash taken over the stage's resolved
config and the hashes of the stages it reads. A folder with a `manifest.json` is complete (every
job writes its manifest last, atomically), so a re-run with the same config reuses it, and a
changed config or upstream output gets a new folder: two configs never mix.

Two runs that need the same stage at once (a `data-large` run still building the shards that a
`large` run started beside it also needs) must not build it into one folder together: the
builder holds a lock on a file in the folder (`building`), and the other run waits for the
manifest. A run that dies lets go of its lock with its process.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipelines import storage

logger = logging.getLogger("flows")

LOCK_NAME = ".build.lock"
"""In the stage's folder while a run builds it (hidden: never read as a stage's input)."""


@dataclass(frozen=True)
class StageResult:
    """What a stage hands downstream: where its output is and what it was made from."""
    stage: str
    path: str
    config_hash: str
    cached: bool
    seconds: float
    manifest: dict = field(default_factory=dict, compare=False, repr=False)


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
    return StageResult(stage, path, digest, cached=True, seconds=0.0, manifest=manifest)


@contextlib.contextmanager
def building(path: str, stage: str, poll_seconds: float = 10.0) -> Iterator[None]:
    """Hold `path`'s build lock for the block, waiting while another run holds it.

    An advisory `flock` on `<path>/.build.lock`: the kernel lets go of it when its holder's
    file closes, so also when that process dies (kill -9, a lost pod) - no lease to expire, no
    clocks or pids to compare. It excludes processes on one machine and, on a shared volume
    whose client maps flock to NFS locks (Linux NFSv4), across machines. Object-store roots
    (gs://) have no lock: their runs are not told about each other (see the README).
    """
    if poll_seconds <= 0:
        raise ValueError(f"poll_seconds must be > 0, got {poll_seconds}")
    if storage.is_remote(path):
        yield
        return
    lock_path = storage.join(path, LOCK_NAME)
    with open(lock_path, "a+", encoding="utf-8") as lock:
        waited = False
        while not _try_lock(lock):
            if not waited:
                logger.info("%s: another run is building %s (%s); waiting for it",
                            stage, path, _holder(lock_path))
                waited = True
            time.sleep(poll_seconds)
        _describe_holder(lock, stage)
        yield  # closing the file releases the lock


def _try_lock(lock) -> bool:
    """True once held, False while another holds it. A filesystem without flock (some FUSE
    mounts) runs unlocked, with a warning: a run must not fail for want of a courtesy."""
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
    with contextlib.suppress(OSError):
        with open(lock_path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or "holder unknown"
    return "holder unknown"
