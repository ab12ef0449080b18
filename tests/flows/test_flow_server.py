"""A killed run leaves nothing running: Prefect's temporary server dies with the flow process.

`bert-dag` (and `make demo`) start a temporary Prefect API server (uvicorn) for the flow; killed
by SIGKILL or SIGTERM, the flow process must take it along, as it takes its trainers.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 20.0
STARTUP_LIMIT_S = 240.0


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory) -> Path:
    # One database for both runs: the second skips the migrations.
    return tmp_path_factory.mktemp("prefect_home")


def _start_flow(prefect_home: Path, output: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(prefect_home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1",
           "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen([sys.executable, "-m", "flows.demo", "--output", str(output)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _wait_for_flow_run(flow: subprocess.Popen) -> list[str]:
    """The flow's output up to Prefect's "Beginning flow run" (the server is up and in use)."""
    seen: list[str] = []
    deadline = time.monotonic() + STARTUP_LIMIT_S
    assert flow.stdout is not None
    for line in flow.stdout:
        seen.append(line.rstrip())
        if "Beginning flow run" in line:
            return seen
        if time.monotonic() > deadline:
            break
    raise AssertionError("the flow did not start:\n" + "\n".join(seen[-30:]))


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_flow_leaves_no_process_running(prefect_home, tmp_path, sig):
    flow = _start_flow(prefect_home, tmp_path / "run")
    run: list[psutil.Process] = []
    try:
        _wait_for_flow_run(flow)
        run = psutil.Process(flow.pid).children(recursive=True)
        servers = [p for p in run if "uvicorn" in p.cmdline()]
        assert len(servers) == 1, [p.cmdline() for p in run]
        assert "prefect.server.api.server:create_app" in servers[0].cmdline()
        os.kill(flow.pid, sig)
        flow.wait(timeout=GONE_WITHIN_S)
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(run) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _alive(run)
        assert not left, [(p.pid, p.cmdline()) for p in left]
    finally:
        for p in _alive([psutil.Process(flow.pid), *run]) if flow.poll() is None else _alive(run):
            p.kill()
        flow.wait()


FLOW_THAT_LOGS_TO_THE_END = """
from prefect import flow, get_run_logger
from flows.server import temporary_server

@flow
def logs():
    for i in range(200):
        get_run_logger().info("line %d", i)

with temporary_server():
    logs()
"""


def test_the_flows_last_log_lines_reach_the_server_before_it_stops(prefect_home):
    """Prefect's log worker sends queued records in batches; drained only at interpreter exit,
    the server is gone by then and the run ends with a connection error instead."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(prefect_home),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(STARTUP_LIMIT_S)}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.run([sys.executable, "-c", FLOW_THAT_LOGS_TO_THE_END], check=False, cwd=REPO,
                         env=env,
                         capture_output=True, text=True, timeout=2 * STARTUP_LIMIT_S)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "line 199" in output and "Finished in state Completed()" in output
    assert "Error logging to API" not in output, output[-3000:]
