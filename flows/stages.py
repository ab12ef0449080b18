"""Content-addressed stage outputs: the mechanism that lets a re-run skip finished work.

A stage's output folder is `<root>/<stage>-<hash>`, the hash taken over the stage's resolved
config and the hashes of the stages it reads. A folder with a `manifest.json` is complete (every
job writes its manifest last, atomically), so a re-run with the same config reuses it, and a
changed config or upstream output gets a new folder: two configs never mix.

Two runs that need the same stage at once (a `data-large` run still building the shards that a
`large` run started beside it also needs) must not build it into one folder together: the
builder holds a lock file in the folder, refreshed while it works, and the other run waits for
the manifest. A lock that stopped being refreshed belongs to a run that died and is taken over.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
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


@dataclass(frozen=True)
class BuildLease:
    """How long a build lock lives without its run, and how often others look at it."""
    seconds: float = 300.0
    """A lock not refreshed for this long is a dead run's and is taken over (refreshed every
    fifth of it). A run on this host whose process is gone loses its lock at once."""
    poll_seconds: float = 10.0
    """How often a run waiting for another's build looks again."""
    settle_seconds: float = 3.0
    """Object stores (gs://) have no create-if-absent through Beam's FileSystems: a claim is
    written, then read back after this long, and the last writer holds it."""


def run_stage(root: str, stage: str, config: dict[str, Any], build: Callable[[str], dict | None],
              upstream: tuple[StageResult, ...] = (),
              lease: BuildLease = BuildLease()) -> StageResult:
    """Reuse `<root>/<stage>-<hash>` if complete, else call `build(path)` to make it.

    `build` must leave `manifest.json` in `path` when (and only when) it succeeded; it may find
    a partial previous attempt there (pre-training resumes from its last checkpoint). While
    another live run builds the same folder, this one waits for it and reuses its output.
    """
    path, digest = stage_dir(root, stage, config, upstream)
    manifest = storage.read_manifest(path)
    if manifest is None:
        storage.makedirs(path)
        with building(path, stage, lease):
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
def building(path: str, stage: str, lease: BuildLease = BuildLease()) -> Iterator[None]:
    """Hold `path`'s build lock for the block: wait while a live run holds it, take it over
    from a dead one, refresh it meanwhile, remove it after (also when the build fails)."""
    lock_path = storage.join(path, LOCK_NAME)
    mine = {"token": uuid.uuid4().hex, "stage": stage, "host": socket.gethostname(),
            "pid": os.getpid(), "started": time.time()}
    waiting_for = None
    while not _claim(lock_path, {**mine, "refreshed": time.time()}, lease):
        holder = _read_lock(lock_path)
        if holder is None:
            continue  # released between our claim and this look: claim again
        if _dead(holder, lease):
            logger.warning("%s: taking over the build lock of a run that stopped (%s)",
                           stage, _describe(holder))
            _release(lock_path, holder["token"])
            continue
        if holder["token"] != waiting_for:
            logger.info("%s: another run is building it (%s); waiting for it to finish",
                        stage, _describe(holder))
            waiting_for = holder["token"]
        time.sleep(lease.poll_seconds)
    stop = threading.Event()
    heartbeat = threading.Thread(target=_refresh, args=(lock_path, mine, lease, stop),
                                 name=f"lock-{stage}", daemon=True)
    heartbeat.start()
    try:
        yield
    finally:
        stop.set()
        heartbeat.join()
        _release(lock_path, mine["token"])


def _claim(lock_path: str, holder: dict, lease: BuildLease) -> bool:
    data = json.dumps(holder).encode()
    if not storage.is_remote(lock_path):
        return storage.create_exclusive(lock_path, data)
    if storage.exists(lock_path):
        return False
    storage.atomic_write_bytes(lock_path, data)
    time.sleep(lease.settle_seconds)  # a run that looked before we wrote has written by now
    current = _read_lock(lock_path)
    return current is not None and current["token"] == holder["token"]


def _read_lock(lock_path: str) -> dict | None:
    try:
        holder = storage.read_json(lock_path)
    except (OSError, ValueError):  # gone (released), or not ours to read
        return None
    return holder if isinstance(holder, dict) and "token" in holder else None


def _dead(holder: dict, lease: BuildLease) -> bool:
    if holder.get("host") == socket.gethostname() and not _process_alive(holder.get("pid")):
        return True
    return time.time() - float(holder.get("refreshed", 0)) > lease.seconds


def _process_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True  # another user's process, or no pid to test: trust the refresh time
    return True


def _refresh(lock_path: str, mine: dict, lease: BuildLease, stop: threading.Event) -> None:
    while not stop.wait(lease.seconds / 5):
        current = _read_lock(lock_path)
        if current is None or current["token"] != mine["token"]:
            logger.error("%s: lost the build lock %s (not refreshed for %.0f s?)",
                         mine["stage"], lock_path, lease.seconds)
            return
        storage.atomic_write_json(lock_path, {**mine, "refreshed": time.time()})


def _release(lock_path: str, token: str) -> None:
    current = _read_lock(lock_path)
    if current is not None and current["token"] == token:
        storage.delete(lock_path)


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder.get("started", 0))))
    return f"host {holder.get('host')}, pid {holder.get('pid')}, since {started}"
