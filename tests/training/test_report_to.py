"""Pre-training's experiment trackers (`report_to`, training/trackers.py), read back from a REAL
local MLflow store, REAL W&B offline run files and TensorBoard's event files: the same metrics
as metrics.jsonl, to the bit, the resolved config, loss_curve.png and metrics.jsonl as
artifacts, a resumed run continuing the same tracker runs; `none` writes no tracker files."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.trackers import (
    mlflow_client,
    mlflow_runs,
    no_tracker_account,
    wandb_config,
    wandb_history,
    wandb_saved_files,
)
from tests.training.pretrain_runs import make_config, subprocess_env
from training import config as cfg
from training import pretrain
from training.metrics import MetricsLog
from training.ranks import Dist

ERROR = "bert-pretrain: error:"


def bert_pretrain(data, tmp_path, *sets: str, stop_after: int | None = None) -> None:
    """`bert-pretrain --preset tiny` on the tiny uneven shards: 2 steps, logged each,
    validation at the end."""
    config_file = tmp_path / "run.json"
    if not config_file.exists():
        cfg.save(make_config(data, tmp_path / "run", steps=2, data={"num_workers": 0}),
                 str(config_file))
    argv = ["--preset", "tiny", "--config", str(config_file)]
    argv += [a for s in sets for a in ("--set", s)]
    pretrain.main(argv + (["--stop_after_steps", str(stop_after)] if stop_after else []))


def logged(out, split: str) -> list[tuple[int, float]]:
    return [(r["global_step"], r["loss"]) for r in pretrain.read_metrics(str(out))
            if r["split"] == split]


def test_mlflow_wandb_and_tensorboard_get_the_metrics_config_and_artifacts(data, tmp_path,
                                                                          monkeypatch):
    """Stopped after step 1 of 2 and resumed: one MLflow run holding every step, one W&B run
    id over two offline folders (W&B writes a folder per process), TensorBoard as before."""
    no_tracker_account(monkeypatch, tmp_path)
    bert_pretrain(data, tmp_path, "cadence.report_to=mlflow,wandb,tensorboard", stop_after=1)
    out = tmp_path / "run"
    first = json.loads((out / "trackers.json").read_text())
    # a resume may change cadence.log_every (2 of 2 steps logs step 2 as 1 did): MLflow keeps
    # the parameter it was given and records the new value as a tag
    bert_pretrain(data, tmp_path, "cadence.report_to=mlflow,wandb,tensorboard",
                  "cadence.log_every=2")
    train, validation = logged(out, "train"), logged(out, "validation")
    assert [step for step, _ in train] == [1, 2] and [s for s, _ in validation] == [2]

    (run,) = mlflow_runs(out)
    client = mlflow_client(out)
    assert (run.info.run_id, run.info.run_name, run.info.status) == (
        first["mlflow"], "run", "FINISHED")
    params = run.data.params
    assert (params["model.preset"], params["seed"], params["cadence.log_every"]) == (
        "bert_tiny", "7", "1")
    assert (params["phases.0.steps"], params["phases.0.learning_rate"]) == ("2", "0.002")
    assert params["cadence.report_to"] == "['mlflow', 'wandb', 'tensorboard']"
    assert run.data.tags["resumed.cadence.log_every"] == "2"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == train  # exact floats
    assert [(m.step, m.value) for m in client.get_metric_history(
        run.info.run_id, "validation/loss")] == validation
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
        "loss_curve.png", "metrics.jsonl"]

    folders = sorted((out / "wandb").glob("offline-run-*"))
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [first["wandb"]] * 2
    assert [wandb_history(f, "train/loss") for f in folders] == [train[:1], train[1:]]
    assert wandb_history(folders[1], "validation/loss") == validation
    config = wandb_config(folders[1])
    assert (config["model"]["preset"], config["seed"], config["phases"][0]["steps"]) == (
        "bert_tiny", 7, 2)
    assert [wandb_saved_files(f) for f in folders] == [
        ["metrics.jsonl"], ["loss_curve.png", "metrics.jsonl"]]
    assert (folders[1] / "files" / "loss_curve.png").read_bytes() == \
        (out / "loss_curve.png").read_bytes()
    assert json.loads((out / "trackers.json").read_text()) == first

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [e.step for e in scalars] == [step for step, _ in train]
    assert [e.value for e in scalars] == pytest.approx([loss for _, loss in train],
                                                       rel=1e-7)  # TensorBoard keeps float32


def test_report_to_none_writes_no_tracker_files(tmp_path):
    """The run's MetricsLog with `report_to=none` (as `bert-pretrain --set report_to=none`
    resolves it): metrics.jsonl only, through a whole run's records and its end."""
    config = cfg.resolve("tiny", assignments=["cadence.report_to=none", f"output_dir={tmp_path}"])
    assert config.cadence.report_to == ("none",)
    log = MetricsLog(str(tmp_path), Dist(rank=0, world_size=1, on_gpu=False), None, config)
    line = {"split": "train", "phase_index": 0, "phase": "phase1", "step": 1, "global_step": 1,
            "loss": 8.25}
    log.write(line)
    log.close(loss_curve=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss_curve.png", "metrics.jsonl"]
    assert pretrain.read_metrics(str(tmp_path)) == [line]


def test_an_unknown_tracker_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        pretrain.main(["--preset", "tiny", "--set", "cadence.report_to=tensorboard,comet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{ERROR} --set cadence.report_to: unknown tracker 'comet': expected some of tensorboard, "
        "mlflow, wandb, or none")


@pytest.mark.parametrize("name", ["mlflow", "wandb"])
def test_a_tracker_not_installed_names_its_extra_before_training(name, tmp_path):
    """The package blocked from import (`sys.modules[name] = None`, as if not installed): one
    line naming the extra, exit 2, and no run folder."""
    code = (f"import sys; sys.modules[{name!r}] = None\n"
            "from training.pretrain import main\n"
            f"main(['--preset', 'tiny', '--set', 'cadence.report_to={name}', "
            f"'--set', 'output_dir={tmp_path / 'run'}'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith(ERROR)] == [
        (f"{ERROR} --set cadence.report_to: {name} is chosen but not installed: "
         f"pip install 'bert-dag[{name}]'")]
    assert not (tmp_path / "run").exists()
