"""The flow's report in the trackers pre-training reports to (flows/report.py
`log_to_trackers`): report.md and the loss curve as artifacts of a run of its own, named after
the DAG run's folder, in a REAL local MLflow store and REAL W&B offline files; TensorBoard,
which keeps no files, gets no run."""
from __future__ import annotations

from flows import report as reporting
from flows.config import resolve
from flows.stages import StageResult
from tests.support.trackers import (
    mlflow_client,
    mlflow_runs,
    no_tracker_account,
    wandb_saved_files,
)


def test_the_report_and_its_plot_are_a_tracker_run_of_the_dag_run(tmp_path, monkeypatch):
    no_tracker_account(monkeypatch, tmp_path)
    root = tmp_path / "dag-7"
    cfg = resolve("tiny", {"output": str(root),
                           "pretrain": {"cadence": {"report_to": "mlflow,wandb,tensorboard"}}})
    pretrain = root / "pretrain-abc"
    pretrain.mkdir(parents=True)
    (pretrain / "loss_curve.png").write_bytes(b"\x89PNG not really")
    stage = StageResult("pretrain", str(pretrain), "abc", cached=True, seconds=0.0)
    result = reporting.report(cfg, [stage], None)

    (run,) = mlflow_runs(root)
    assert (run.info.run_name, run.info.status) == ("bert-dag-dag-7", "FINISHED")
    assert run.data.params == {"preset": "tiny", "output": str(root)}
    client = mlflow_client(root)
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "loss_curve.png", "report.md"]
    path = client.download_artifacts(run.info.run_id, "report.md", str(tmp_path))
    with open(path, encoding="utf-8") as f:
        assert f.read() == result["markdown"]
    (folder,) = (root / "wandb").glob("offline-run-*")
    assert wandb_saved_files(folder) == ["loss_curve.png", "report.md"]
    assert not (root / "tensorboard").exists()


def test_a_report_without_trackers_writes_no_tracker_files(tmp_path, monkeypatch):
    no_tracker_account(monkeypatch, tmp_path)
    cfg = resolve("tiny", {"output": str(tmp_path), "pretrain": {"cadence": {"report_to": "tensorboard"}}})
    reporting.report(cfg, [], None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
