"""Content-addressed stage outputs: the mechanism that lets a re-run skip finished work.

A stage's output folder is `<root>/<stage>-<hash>`, the hash taken over the stage's resolved
config and the hashes of the stages it reads. A folder with a `manifest.json` is complete (every
job writes its manifest last, atomically), so a re-run with the same config reuses it, and a
changed config or upstream output gets a new folder: two configs never mix.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines import storage


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
              upstream: tuple[StageResult, ...] = ()) -> StageResult:
    """Reuse `<root>/<stage>-<hash>` if complete, else call `build(path)` to make it.

    `build` must leave `manifest.json` in `path` when (and only when) it succeeded; it may find
    a partial previous attempt there (pre-training resumes from its last checkpoint).
    """
    path, digest = stage_dir(root, stage, config, upstream)
    manifest = storage.read_manifest(path)
    if manifest is not None:
        return StageResult(stage, path, digest, cached=True, seconds=0.0, manifest=manifest)
    storage.makedirs(path)
    started = time.monotonic()
    build(path)
    manifest = storage.read_manifest(path)
    if manifest is None:
        raise RuntimeError(f"stage {stage!r} finished without writing {path}/manifest.json")
    return StageResult(stage, path, digest, cached=False, seconds=time.monotonic() - started,
                       manifest=manifest)
