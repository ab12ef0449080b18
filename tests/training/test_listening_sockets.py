"""What a pre-training process listens on: a single-process `bert-pretrain` binds its sockets to
the loopback interface only, so nothing on another machine can reach it."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time

import psutil

from tests.training.pretrain_runs import REPO, make_config, subprocess_env
from training import config as cfg


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """The addresses the process and its children (the loader's workers) listen on."""
    root = psutil.Process(pid)
    found = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            found.update((c.laddr.ip, c.laddr.port) for c in process.net_connections("inet")
                         if c.status == psutil.CONN_LISTEN)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_single_process_run_listens_on_loopback_only(data, tmp_path):
    config = make_config(data, tmp_path / "run", steps=100_000)
    config_file = tmp_path / "config.json"
    cfg.save(config, str(config_file))
    log = tmp_path / "stderr.log"  # a file, not a pipe nobody reads while the run goes on
    run = subprocess.Popen([sys.executable, "-m", "training.pretrain", "--config",
                            str(config_file)], cwd=REPO, env=subprocess_env(),
                           stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and metrics.stat().st_size) and run.poll() is None:
            assert time.monotonic() < deadline, "no training step within 240 s"
            time.sleep(0.5)
        assert run.poll() is None, log.read_text()[-3000:]  # training: process group is up
        addresses = listening_addresses(run.pid)
    finally:
        run.kill()
        run.wait()
    assert addresses, "the process group's sockets were not found"
    assert all(ipaddress.ip_address(ip).is_loopback for ip, _ in addresses), addresses
