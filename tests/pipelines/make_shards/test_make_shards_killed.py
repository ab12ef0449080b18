"""A make_shards run killed with SIGKILL while it writes a shard, then run again: the killed
run's temporary is gone, other files are left alone, and verify_shards names what is left over."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipelines import make_shards, verify_shards
from tests.conftest import REPO


def args(shared_data: Path, minilm_dir: Path, out: Path) -> list[str]:
    return ["--input", str(shared_data / "books" / "austen-persuasion.txt"), "--vocab",
            str(minilm_dir), "--output", str(out), "--dupe_factor", "1"]


def kill_while_writing(command: list[str], out: Path, timeout: float = 240) -> list[str]:
    """Start `command`, SIGKILL it as soon as a temporary appears in `out`; the temporaries."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if out.is_dir() and any(n.endswith(".tmp") for n in os.listdir(out)):
                proc.kill()
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job ended before it wrote a temporary"
    return sorted(n for n in os.listdir(out) if n.endswith(".tmp"))


def test_rerun_after_kill_removes_only_its_own_temporaries(shared_data, minilm_dir, tmp_path):
    out = tmp_path / "shards"
    left = kill_while_writing([sys.executable, "-m", "pipelines.make_shards",
                               *args(shared_data, minilm_dir, out)], out)
    assert len(left) == 1 and left[0].startswith(".train-000000.tar.")
    # Not this job's: kept. Beam's sink folder of the dead letters: this job's, removed.
    (out / "notes.txt").write_text("mine\n")
    (out / ".notes.txt.abcd1234.tmp").write_text("another tool's temporary\n")
    sink = out / "dead_letter" / f"beam-temp-make_shards-{'0' * 32}"
    sink.mkdir(parents=True)
    (sink / "part").write_text("{}\n")

    make_shards.main(args(shared_data, minilm_dir, out))

    assert sorted(p.name for p in out.iterdir()) == [
        ".notes.txt.abcd1234.tmp", "dead_letter", "manifest.json", "notes.txt",
        "train-000000.tar"]
    assert sorted(p.name for p in (out / "dead_letter").iterdir()) == ["make_shards.jsonl"]
    problems, _ = verify_shards.verify_folder(str(out), progress=False)
    assert problems == [".notes.txt.abcd1234.tmp: a temporary left by a killed run",
                        "notes.txt: not in the manifest (left from another run?)"]


def test_verify_shards_reports_every_unexpected_file(one_worker, tmp_path, capsys):
    out, _ = one_worker
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert verify_shards.main([str(copy), "--quiet"]) == 0
    (copy / ".train-000001.tar.x7k2m9qa.tmp").write_bytes(b"\0" * 1000)
    (copy / "stray.bin").write_bytes(b"?")
    (copy / "dead_letter" / "old.jsonl").write_text("")
    capsys.readouterr()
    assert verify_shards.main([str(copy), "--quiet"]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed[-4:] == [
        "FAILED: 3 problem(s)",
        "  .train-000001.tar.x7k2m9qa.tmp: a temporary left by a killed run",
        "  dead_letter/old.jsonl: not in the manifest (left from another run?)",
        "  stray.bin: not in the manifest (left from another run?)"]


def test_verify_shards_accepts_the_folder_a_flow_stage_built(one_worker, tmp_path, capsys):
    """The flow's stage machinery leaves its build lock in the finished folder; the documented
    check of that folder passes, and a stray file beside the lock is still named."""
    from flows import stages
    out, _ = one_worker

    def build(path: str) -> None:
        shutil.copytree(out, path, dirs_exist_ok=True)

    built = stages.run_stage(str(tmp_path), "shards", {"k": 1}, build)
    folder = Path(built.path)
    assert (folder / stages.LOCK_NAME).read_text().startswith("stage shards, host ")
    capsys.readouterr()
    assert verify_shards.main([str(folder), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "OK: every shard matches the manifest"
    (folder / "stray.bin").write_bytes(b"?")
    assert verify_shards.verify_folder(str(folder), progress=False)[0] == [
        "stray.bin: not in the manifest (left from another run?)"]
