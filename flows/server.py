"""Prefect's temporary API server, tied to the flow process's life.

With no PREFECT_API_URL, Prefect starts a temporary server (uvicorn, ~200 MB) as a plain child
and stops it at interpreter exit; a flow process killed by SIGKILL (or by an unhandled SIGTERM,
which skips `atexit`) leaves that server running, re-parented to init. `temporary_server()`
starts the same server itself, under the same death signal the trainers get
(`launch.EXEC_WITH_PDEATHSIG`: Linux sends it SIGTERM when the flow process dies, however it
dies), and points Prefect at it; with PREFECT_API_URL set (a real server) it does nothing.
The server has no UI, so the flow prints no "View at" link to one.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from flows.launch import EXEC_WITH_PDEATHSIG

PORT_IN_USE = 3  # uvicorn's exit status when its port was taken between our check and its bind
STOP_GRACE_S = 5.0


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(port: int) -> list[str]:
    """Prefect's own temporary-server command (`SubprocessASGIServer._run_uvicorn_command`),
    run through the death-signal wrapper."""
    import prefect

    return [sys.executable, "-c", EXEC_WITH_PDEATHSIG, sys.executable, "-m", "uvicorn",
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]


def _server_env() -> dict[str, str]:
    from prefect.settings import get_current_settings

    return {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True)}


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> bool | None:
    """True once the server answers, False if its port was taken, None on timeout.

    The timeout counts 0.1-s polls, as Prefect's own start does: on a loaded machine each poll
    takes longer, and the server gets the same chance it would get from Prefect."""
    import httpx

    waited = 0.0
    with httpx.Client() as client:
        while waited < timeout_s:
            if proc.poll() is not None:
                if proc.returncode == PORT_IN_USE:
                    return False
                raise RuntimeError(f"Prefect's temporary server exited with status "
                                   f"{proc.returncode} before answering on {url}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/health").status_code == 200:
                    return True
            time.sleep(0.1)
            waited += 0.1
    return None


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def temporary_server() -> Iterator[str | None]:
    """Run the body against a temporary Prefect server that dies with this process; yields its
    API URL (None where PREFECT_API_URL already names a server, which is then used)."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_UI_URL,
        temporary_settings,
    )

    if PREFECT_API_URL.value():
        yield None
        return
    timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    for _ in range(10):
        port = _free_port()
        url = f"http://127.0.0.1:{port}/api"
        proc = subprocess.Popen(server_command(port), env=_server_env())
        try:
            healthy = _wait_healthy(proc, url, timeout_s)
        except BaseException:
            stop(proc)
            raise
        if healthy:
            break
        stop(proc)
        if healthy is None:
            raise RuntimeError(f"Prefect's temporary server did not answer on {url} within "
                               f"{timeout_s:.0f} s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
    else:
        raise RuntimeError("Prefect's temporary server found no free port in 10 tries")
    try:
        # the server serves no UI (PREFECT_UI_ENABLED=0): no "View at" line linking to it
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_UI_URL: ""}):
            try:
                yield url
            finally:
                drain_logs()
    finally:
        stop(proc)


def drain_logs(timeout_s: float = 10.0) -> None:
    """Send the flow's queued log records and events while the server still answers: Prefect's log worker
    otherwise drains at interpreter exit, after the server has stopped, and prints a
    connection error in place of the run's last lines."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=timeout_s)
    EventsWorker.drain_all(timeout=timeout_s)
