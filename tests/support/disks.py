"""A small real filesystem to fill: the full-disk tests mount a tmpfs of a given size."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: "64k", "16m") mounted below `parent`, unmounted
    after; the test skips where mounting needs a root this process is not, or is refused."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    mount = parent / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:  # a process the test failed to end may still hold a file: detach the mount lazily
        if subprocess.run(["umount", str(mount)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=False)
