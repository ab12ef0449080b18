"""The Beam jobs on a full disk, for real: their output on a small tmpfs (needs root to mount).

Each job runs as users run it (`python -m pipelines.<job>`); it must end with exactly one
line, `<job>: error: no space left on the device writing <file>: ...left there`, no traceback
and no ERROR record on stderr, exit code 2, and no manifest (nothing that looks complete).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.errors import human_bytes
from tests.conftest import REPO
from tests.support.disks import small_tmpfs

DUMP = "wiki/enwiki-dbpedia-minidump-pages-articles.xml.bz2"
MULTI_PROCESSING = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
DISK = 64 * 1024  # a tmpfs this small fills on the first shard of either job's input here


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 64 KiB tmpfs mounted for the test (unmounted after it)."""
    with small_tmpfs(tmp_path, f"{DISK // 1024}k") as mount:
        yield mount


def run_job(job: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"pipelines.{job}", *args], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def assert_one_line_error(done: subprocess.CompletedProcess, job: str, expected: str) -> None:
    stderr = done.stderr
    assert done.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not re.search(r"^\S+ \S+ (ERROR|CRITICAL) ", stderr, re.MULTILINE), stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith(f"{job}: error:")] == [
        expected]
    assert stderr.splitlines()[-1] == expected


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("mode", [[], MULTI_PROCESSING], ids=["in_memory", "multi_processing"])
def test_extract_wikipedia_on_a_full_disk(shared_data, full_disk, mode):
    out = full_disk / "wiki"
    done = run_job("extract_wikipedia", "--input", str(shared_data / DUMP), "--output", str(out),
                   *mode)
    left = human_bytes(shutil.disk_usage(full_disk).free)
    assert_one_line_error(done, "extract_wikipedia", (
        f"extract_wikipedia: error: no space left on the device writing "
        f"{out}/documents-00000-of-00001.parquet: {left} left there"))
    assert files_under(out) == []  # no manifest, no partial shard, no temporary


@pytest.mark.parametrize("mode", [[], MULTI_PROCESSING], ids=["in_memory", "multi_processing"])
def test_make_shards_on_a_full_disk_names_the_shard_and_its_size(shared_data, minilm_dir,
                                                                full_disk, tmp_path, mode):
    args = ["--input", str(shared_data / "books" / "blake-poems.txt"), "--vocab",
            str(minilm_dir), "--dupe_factor", "2"]
    roomy = tmp_path / "roomy"
    assert run_job("make_shards", *args, "--output", str(roomy)).returncode == 0
    shard_bytes = (roomy / "train-000000.tar").stat().st_size
    assert shard_bytes > DISK

    out = full_disk / "shards"
    done = run_job("make_shards", *args, "--output", str(out), *mode)
    left = human_bytes(shutil.disk_usage(full_disk).free)
    assert_one_line_error(done, "make_shards", (
        f"make_shards: error: no space left on the device writing {out}/train-000000.tar: "
        f"it needs {human_bytes(shard_bytes)}, {left} left there"))
    # The (empty) dead letters only: no manifest, no partial shard, no temporary.
    assert files_under(out) == ["dead_letter/make_shards.jsonl"]
