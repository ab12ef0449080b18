"""Launched jobs: a cancelled subprocess group is stopped, no stale rendezvous, the caller's
accelerator reaches the trainers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import launch


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_cancelled_subprocess_group_is_stopped(tmp_path, sig):
    """Cancelling the flow (SIGTERM to its process) or killing it must take the trainer down."""
    marker = tmp_path / "child.pid"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                       "time.sleep(600)\n")
    script = (f"import sys\nfrom flows.launch import run_subprocess\n"
              f"run_subprocess([sys.executable, {str(trainer)!r}])\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(100):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.1)
    child = int(marker.read_text())
    parent.send_signal(sig)
    parent.wait(30)
    time.sleep(0.5)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def test_a_launched_job_gets_no_stale_rendezvous(monkeypatch):
    """An in-process run leaves RANK/MASTER_PORT in os.environ; the pretrain job the flow
    launches must pick its own port, not bind one that is still in use."""
    monkeypatch.setenv("MASTER_PORT", "58713")
    monkeypatch.setenv("RANK", "0")
    lines: list[str] = []
    show = "import os; print(os.environ.get('MASTER_PORT'), os.environ.get('RANK'), " \
           "os.environ['DS_ACCELERATOR'])"
    launch.run_subprocess([sys.executable, "-c", show], log=lines.append)
    assert lines[-1] == "None None cpu"


def test_launched_trainers_take_the_callers_accelerator_or_torchs(monkeypatch):
    """DS_ACCELERATOR passes through (the GPU image sets cuda); unset, it follows torch, so a
    GPU machine's trainers are not sent to the CPU (it used to be "cpu" whenever unset)."""
    import torch

    show = "import os; print(os.environ['DS_ACCELERATOR'])"
    for setting, expected in (("cuda", "cuda"), (None, "cuda" if torch.cuda.is_available()
                                                 else "cpu")):
        if setting:
            monkeypatch.setenv("DS_ACCELERATOR", setting)
        else:
            monkeypatch.delenv("DS_ACCELERATOR", raising=False)
        lines: list[str] = []
        launch.run_subprocess([sys.executable, "-c", show], log=lines.append)
        assert lines[-1] == expected


def test_a_relayed_jobs_log_lines_leave_the_time_to_the_relay():
    """The flow's logger stamps each relayed line's time: the job's own lines carry none (a
    line twice timed is noise), and a progress bar's line never has a log line run into it."""
    child = ("import logging\nfrom common import logs\nlogs.setup()\n"
             "bar = logs.progress(total=2, desc='phase1')\nbar.update(1)\n"
             "logging.getLogger('training.pretrain').info('exported step 1')\nbar.update(1)\n"
             "bar.close()\n")
    lines: list[str] = []
    launch.run_subprocess([sys.executable, "-c", child], log=lines.append)
    assert [line.split("|")[0] for line in lines[1:]] == [
        "phase1:   0%", "INFO training.pretrain: exported step 1", "phase1: 100%"]
