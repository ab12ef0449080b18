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


@pytest.mark.parametrize("how", ["job", "thread"])
def test_kill_9_leaves_no_beam_worker(shared_data, minilm_dir, tmp_path, how):
    job_args = ["--input", str(shared_data / "books" / "austen-persuasion.txt"), "--vocab",
                str(minilm_dir), "--output", str(tmp_path / "shards"), "--dupe_factor", "1",
                *MULTI_PROCESSING]
    start = ["-m", "pipelines.make_shards"] if how == "job" else ["-c", IN_A_THREAD]
    job = subprocess.Popen([sys.executable, *start, *job_args], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = workers_of(job.pid)
        assert len(workers) == 2, f"the job started {len(workers)} worker(s)"
        time.sleep(1)  # the workers are at work
        assert job.poll() is None, "the job ended before the kill: nothing was tested"
        job.send_signal(signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 5
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [w.pid for w in workers if alive(w)] == []
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        for worker in workers:  # the test's own processes, whatever the outcome
            if alive(worker):
                worker.kill()
