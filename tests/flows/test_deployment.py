"""A real Prefect server and deployment: the tiny flow run, then a rerun that reuses every stage."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


BIN = Path(sys.executable).parent


# ---------------------------------------------------------------- real server + deployment

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def prefect_server(tmp_path):
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "BERT_DAG_HOME": str(REPO), "BERT_IMAGE": "bert-dag:test", "DS_ACCELERATOR": "cpu",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (the server writes to it until teardown)
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError("Prefect server did not become healthy in 120 s: "
                               + (tmp_path / "server.log").read_text()[-2000:])
        yield env
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _prefect(env, *args, timeout=600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=REPO, capture_output=True, check=False,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out


def _artifacts(env, flow_run_id: str) -> dict[str, object]:
    code = (
        "import json, sys\n"
        "from prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId\n"
        "with get_client(sync_client=True) as c:\n"
        "    arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id="
        "ArtifactFilterFlowRunId(any_=[sys.argv[1]])))\n"
        "    print(json.dumps({a.key: a.data for a in arts}))\n")
    out = subprocess.run([sys.executable, "-c", code, flow_run_id], env=env, capture_output=True, check=False,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_deployment(env, overrides, data_only: bool = False) -> str:
    params = {"preset": "tiny", "overrides": overrides, "data_only": data_only}
    out = _prefect(env, "deployment", "run", "pretrain-bert/tiny", "--params",
                   json.dumps(params), "--watch",
                   "--watch-timeout", "900", timeout=960)
    flow_run_id = next(line.split("UUID:")[1].strip() for line in out.stdout.splitlines()
                       if "UUID:" in line)
    assert "Completed" in out.stdout, out.stdout[-3000:]
    return flow_run_id


def test_deployment_run_tiny_then_rerun_reuses_every_stage(prefect_server, tmp_path):
    env = prefect_server
    _prefect(env, "work-pool", "create", "local-process", "--type", "process")
    _prefect(env, "--no-prompt", "deploy", "--name", "tiny")
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 (the worker writes to it)
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "local-process"],
                              env=env, cwd=REPO, stdout=worker_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    overrides = {
        "output": str(tmp_path / "run"),
        "shards": {"dupe_factor": 1},
        "pretrain": {"phase1": {"steps": 8, "warmup_steps": 2, "global_batch_size": 16,
                                "micro_batch_size": 16},
                     "phase2": {"steps": 3, "warmup_steps": 1, "global_batch_size": 4,
                                "micro_batch_size": 4}},
        # The bundled sample has no WNLI: that run fails, and must not take RTE down with it.
        "finetune": {"tasks": ["rte", "wnli"], "learning_rates": [1e-4], "seeds": [1],
                     "epochs": 1, "max_train_examples": 32, "max_eval_examples": 32},
    }
    try:
        data = _artifacts(env, _run_deployment(env, overrides, data_only=True))
        first = _artifacts(env, _run_deployment(env, overrides))
        second = _artifacts(env, _run_deployment(env, overrides))
    finally:
        os.killpg(worker.pid, signal.SIGINT)  # the worker may ignore SIGTERM for long
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)

    assert {"stage-timings", "report", "finetune-results", "loss-curve"} <= set(first)
    stages_data = {row["stage"]: row["cached"] for row in json.loads(data["stage-timings"])}
    stages_first = {row["stage"]: row["cached"] for row in json.loads(first["stage-timings"])}
    stages_second = {row["stage"]: row["cached"] for row in json.loads(second["stage-timings"])}
    data_stages = {"wikipedia", "books", "documents-poems", "corpus", "audit", "vocab",
                   "shards128", "shards256"}
    assert stages_data == dict.fromkeys(data_stages, False)  # data_only builds the data alone
    assert "finetune-results" not in data and "loss-curve" not in data
    assert set(stages_first) == data_stages | {"pretrain", "export"}
    # the full run reuses the data stages and builds the rest; a second one reuses everything
    assert stages_first == {**dict.fromkeys(data_stages, True), "pretrain": False, "export": False}
    assert all(stages_second.values())
    assert "RTE" in first["finetune-results"] and "WNLI" not in first["finetune-results"]
    report = (tmp_path / "run" / "report.md").read_text()  # the full run's, not the data run's
    assert "FAILED" in report and "'task': 'wnli'" in report
    assert "| shards256 | no |" in (tmp_path / "run" / "report-data.md").read_text()
    assert "| pretrain | yes |" in report
    assert (tmp_path / "run" / "finetune").is_dir()
