"""Beam's worker processes (`--direct_running_mode=multi_processing`) end with their parent:
a kill -9 of the job, or of a process that runs it in a thread as the Prefect flow does
(flows/steps.py calls the job's `run` in its task thread), leaves none running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

MULTI_PROCESSING = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
IN_A_THREAD = ("import sys, threading; from pipelines import make_shards; "
               "t = threading.Thread(target=make_shards.main, args=(sys.argv[1:],)); "
               "t.start(); t.join()")


def workers_of(pid: int) -> list[psutil.Process]:
    """The Python processes below `pid` (Beam starts its workers through `sh -c`)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in children if "python" in os.path.basename(_exe(c))]


def beam_workers(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if "pipelines.beam_worker" in _cmdline(p)]


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _exe(process: psutil.Process) -> str:
    try:
        return process.cmdline()[0]
    except (psutil.Error, IndexError):
        return ""


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("how", ["job", "thread", "waves"])
def test_kill_9_leaves_no_beam_worker(shared_data, minilm_dir, tmp_path, how):
    """`waves`: the job in waves, each a process forked from a fork server
    (`waves.run_isolated`), so the workers' parent is that process, not the job: they end
    with the job all the same, and write no shard after the kill."""
    job_args = ["--input", str(shared_data / "books" / "austen-persuasion.txt"), "--vocab",
                str(minilm_dir), "--output", str(tmp_path / "shards"), "--dupe_factor", "1",
                *MULTI_PROCESSING, *(["--wave_mb", "0.1"] if how == "waves" else [])]
    start = ["-c", IN_A_THREAD] if how == "thread" else ["-m", "pipelines.make_shards"]
    job = subprocess.Popen([sys.executable, *start, *job_args], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(beam_workers(workers)) < 2 and job.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.2)
            workers = workers_of(job.pid)
        assert len(beam_workers(workers)) == 2, f"the job started {len(workers)} worker(s)"
        # with waves also the fork server, its resource tracker and the wave's process
        assert len(workers) == (5 if how == "waves" else 2), workers
        time.sleep(1)  # the workers are at work
        assert job.poll() is None, "the job ended before the kill: nothing was tested"
        job.send_signal(signal.SIGKILL)
        job.wait()
        killed = time.monotonic()
        deadline = killed + 5
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"{how}: the job's processes ended {time.monotonic() - killed:.2f} s after it")
        assert [w.pid for w in workers if alive(w)] == []
        shards = sorted(p.name for p in (tmp_path / "shards").glob("*.tar"))
        time.sleep(1)
        assert sorted(p.name for p in (tmp_path / "shards").glob("*.tar")) == shards
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        for worker in workers:  # the test's own processes, whatever the outcome
            if alive(worker):
                worker.kill()
