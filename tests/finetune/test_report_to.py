"""Fine-tuning's experiment trackers (`--report_to`, finetune/loop.py `tracked_run`), read back
from a REAL local MLflow store: each (task, rate, seed) run is a tracker run named like its
run file, with the loop's config, the loss of every step, the dev metrics of results.json and
the run's results.json and dev predictions as artifacts. Real MiniLM runs on 8 sample RTE rows."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from finetune.cli import main
from tests.conftest import REPO
from tests.finetune.test_finetune_runs_kept import argv, rte_data  # noqa: F401 (a fixture)
from tests.support.trackers import mlflow_client, mlflow_runs, no_tracker_account


def test_each_run_is_an_mlflow_run_with_its_dev_metrics_and_losses(minilm_dir, rte_data,  # noqa: F811
                                                                   tmp_path, monkeypatch):
    no_tracker_account(monkeypatch, tmp_path)
    out = tmp_path / "out"
    assert main([*argv(minilm_dir, rte_data, out, "5e-5"), "--report_to", "mlflow"]) == 0
    (result,) = json.loads((out / "results.json").read_text())["tasks"][0]["runs"]
    (run,) = mlflow_runs(out)
    (run_file,) = (out / "runs").glob("*.json")
    assert run_file.name.startswith(f"{run.info.run_name}-") and run.info.run_name == \
        "rte-lr5e-05-seed1"
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (params["learning_rates"], params["batch_size"], params["report_to"]) == (
        "(5e-05,)", "2", "('mlflow',)")
    client = mlflow_client(out)
    assert {k: v for k, v in run.data.metrics.items() if k.startswith("dev/")} == {
        f"dev/{k}": v for k, v in result["metrics"].items()}
    (accuracy,) = client.get_metric_history(run.info.run_id, "dev/accuracy")
    assert (accuracy.step, accuracy.value) == (result["steps"], result["metrics"]["accuracy"])
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == list(range(1, result["steps"] + 1)) == [1, 2, 3, 4]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == [
        "predictions_dev.tsv", "results.json"]
    predictions = client.download_artifacts(run.info.run_id, "predictions_dev.tsv", str(tmp_path))
    with open(predictions, encoding="utf-8") as f:
        assert f.read() == (out / "RTE" / "predictions_dev.tsv").read_text()  # the only run
    path = client.download_artifacts(run.info.run_id, "results.json", str(tmp_path))
    with open(path, encoding="utf-8") as f:
        logged = json.load(f)
    assert (logged["metrics"], logged["steps"]) == (result["metrics"], result["steps"])
    assert not (out / "wandb").exists() and not (out / "tensorboard").exists()


@pytest.mark.parametrize("value, message", [
    ("comet", ("--report_to: unknown tracker 'comet': expected some of tensorboard, mlflow, "
               "wandb, or none")),
    ("wandb", "--report_to: wandb is chosen but not installed: pip install 'bert-dag[wandb]'"),
])
def test_a_tracker_unknown_or_not_installed_is_one_line_and_exit_2(value, message, tmp_path):
    """`wandb` blocked from import (`sys.modules["wandb"] = None`, as if not installed)."""
    code = ("import sys; sys.modules['wandb'] = None\n"
            "from finetune.cli import main\n"
            f"sys.exit(main(['--model', 'm', '--data', 'd', '--tasks', 'rte', '--output', "
            f"{str(tmp_path / 'out')!r}, '--report_to', {value!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == f"bert-finetune: error: {message}"
    assert not (tmp_path / "out").exists()
