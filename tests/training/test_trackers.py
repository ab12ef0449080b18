"""training/trackers.py on its own: the names `report_to` takes, when W&B runs offline, and
offline W&B and a local MLflow store making no network call (Python's audit hooks see every
name lookup and socket of the process: both packages' usage telemetry would post otherwise)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common.settings import SettingError
from tests.conftest import REPO
from tests.support.trackers import no_tracker_account, wandb_history
from training.trackers import check_names, has_wandb_key, wandb_mode


@pytest.mark.parametrize("names, chosen", [
    ((), ()), (("none",), ()), (("",), ()), (("tensorboard",), ("tensorboard",)),
    ((" MLflow", "wandb"), ("mlflow", "wandb")),
])
def test_the_names_report_to_takes(names, chosen):
    assert check_names(names) == chosen


@pytest.mark.parametrize("names, message", [
    (("comet",), ("--report_to unknown tracker 'comet': expected some of tensorboard, "
                  "mlflow, wandb, or none")),
    (("none", "mlflow"), ("--report_to unknown tracker 'none': expected some of tensorboard, "
                          "mlflow, wandb, or none")),
    (("mlflow", "mlflow"), "--report_to names a tracker twice: mlflow,mlflow"),
])
def test_bad_names_are_one_line_naming_the_setting(names, message):
    with pytest.raises(SettingError) as error:
        check_names(names)
    assert str(error.value) == message


def test_wandb_is_offline_without_a_key_and_online_with_one(tmp_path, monkeypatch):
    no_tracker_account(monkeypatch, tmp_path)
    assert (has_wandb_key(), wandb_mode()) == (False, "offline")
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert (has_wandb_key(), wandb_mode()) == (True, "online")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode() == "online"


OFFLINE_RUN = """
import atexit, socket, sys
network = []
atexit.register(lambda: print(network))  # the first registered runs last, after W&B's own
def audit(event, args):
    if event == "socket.getaddrinfo" or (event == "socket.connect"
                                         and args[0].family != socket.AF_UNIX):
        network.append((event, args[:2] if event == "socket.getaddrinfo" else args[1]))
sys.addaudithook(audit)
from training.trackers import open_trackers
with open_trackers(["wandb", "mlflow"], sys.argv[1], "offline", {"seed": 7}) as trackers:
    trackers.log_metrics({"train/loss": 0.5}, 1)
"""


def test_offline_wandb_and_a_local_mlflow_store_make_no_network_call(tmp_path, monkeypatch):
    no_tracker_account(monkeypatch, tmp_path)
    # as a user's shell: MLflow keeps its telemetry off by itself under pytest and in CI
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS")}
    done = subprocess.run([sys.executable, "-c", OFFLINE_RUN, str(tmp_path / "run")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[]"
    (folder,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert wandb_history(folder, "train/loss") == [(1, 0.5)]


def test_a_tracker_that_fails_is_warned_about_and_dropped_and_the_run_goes_on(
        tmp_path, monkeypatch, caplog):
    """An MLflow store that cannot be opened (its folder is a file) and a TensorBoard
    whose folder turns into a file mid-run: each is one warning, the others keep logging."""
    from training.trackers import open_trackers

    no_tracker_account(monkeypatch, tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/a-file/mlflow.db")
    with caplog.at_level("WARNING", logger="training.trackers"):
        trackers = open_trackers(["mlflow", "tensorboard"], str(tmp_path / "run"), "run",
                                 {"seed": 7})
        assert list(trackers.trackers) == ["tensorboard"]
        trackers.trackers["tensorboard"].writer.close()
        trackers.trackers["tensorboard"].writer = None  # its next call raises
        trackers.log_metrics({"train/loss": 0.5}, 1)
        assert not trackers and trackers.log_metrics({"train/loss": 0.4}, 2) is None
        trackers.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings[0].startswith("report_to mlflow: the run is not tracked there (")
    assert warnings[1].startswith("report_to tensorboard: logging metrics failed (")
    assert len(warnings) == 2
