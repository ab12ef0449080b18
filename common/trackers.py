"""Experiment trackers (`report_to`, spelled as the Hugging Face Trainer spells it).

    trackers = open_trackers(("mlflow", "wandb"), run_dir, "rte-lr2e-05-seed1", config)
    trackers.log_metrics({"train/loss": 0.69}, step=10)
    trackers.log_artifact("loss_curve.png")
    trackers.close()

Names: `tensorboard` (`<run_dir>/tensorboard/`), `mlflow`, `wandb`; `none` or nothing: no
tracker. Each third-party package is imported only when chosen; one chosen but not installed
is one line naming the extra (`pip install 'bert-dag[mlflow]'`), raised by `check_names` when
the config is validated, before anything trains.

- mlflow: the tracking URI in `MLFLOW_TRACKING_URI` when set (as the Trainer's MLflowCallback
  reads it), else a local store under the run folder: `<run_dir>/mlruns/mlflow.db` (SQLite)
  with the artifacts in `<run_dir>/mlruns/artifacts/`. MLflow 3 refuses its plain file store
  (`./mlruns` folders) unless `MLFLOW_ALLOW_FILE_STORE=true`, and names SQLite as the local
  store it keeps up; read it with `mlflow ui --backend-store-uri sqlite:///<run_dir>/mlruns/mlflow.db`
  or `MlflowClient(tracking_uri=...)`. Experiment: `MLFLOW_EXPERIMENT_NAME`, else `bert-dag`.
  MLflow's usage telemetry is off unless `MLFLOW_DISABLE_TELEMETRY=false`.
- wandb: `WANDB_MODE` when set; else online with a key (`WANDB_API_KEY`, or a `wandb login`
  entry in the netrc file) and offline without one, which makes no network call (W&B's usage
  telemetry included: it follows the process's settings, `wandb.setup`) and leaves the
  run in `<WANDB_DIR or run_dir>/wandb/offline-run-*` (`wandb sync` uploads it later). Project:
  `WANDB_PROJECT`, else `bert-dag`.

Resuming (`resume=True`): the MLflow run id and the W&B run id are kept in
`<run_dir>/trackers.json`, so a resumed pre-training run continues the same MLflow run and the
same W&B run id (offline, W&B writes one run folder per process, each with that id). The steps between the checkpoint resumed from and the kill are logged again: MLflow
keeps both values in the metric's history (metrics.jsonl keeps only the redone ones); an
online W&B run drops values at steps it has already seen.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import netrc
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from common import storage
from common.settings import SettingError

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")
"""The trackers `report_to` may name."""
NONE = "none"
"""`report_to=none`: no tracker (as is an empty `report_to`)."""
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The module each tracker imports."""
EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}
"""The bert-dag extra that installs a tracker (tensorboard is a dependency of the project)."""
IDS_FILE = "trackers.json"
"""Where a run folder keeps its tracker run ids, for a resumed run."""
PROJECT = "bert-dag"
"""The MLflow experiment and W&B project unless the environment names another."""


class Tracker(Protocol):
    """One experiment tracker's run."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_artifact(self, path: str) -> None: ...

    def close(self) -> None: ...


def check_names(names: Sequence[str], setting: str = "report_to") -> tuple[str, ...]:
    """The trackers `names` choose (none for `none` or nothing); SettingError naming `setting`
    for an unknown name, `none` beside another, or a tracker whose package is not installed."""
    chosen = tuple(name.strip().lower() for name in names if name.strip())
    if chosen == (NONE,):
        return ()
    for name in chosen:
        if name not in TRACKERS:
            raise SettingError(setting, f"unknown tracker {name!r}: expected some of "
                               f"{', '.join(TRACKERS)}, or {NONE}")
    if len(set(chosen)) != len(chosen):
        raise SettingError(setting, f"names a tracker twice: {','.join(chosen)}")
    for name in chosen:
        if not _installed(PACKAGES[name]):
            extra = EXTRAS.get(name)
            fix = f"pip install 'bert-dag[{extra}]'" if extra else f"pip install {name}"
            raise SettingError(setting, f"{name} is chosen but not installed: {fix}")
    return chosen


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken package
        return False


class TensorBoardTracker:
    """Scalars in `<run_dir>/tensorboard/`; the config as text. TensorBoard keeps no files, so
    artifacts stay where they are."""

    def __init__(self, run_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_artifact(self, path: str) -> None:
        pass

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """One MLflow run (see the module docstring for the store)."""

    def __init__(self, run_dir: str, run_name: str, run_id: str | None = None):
        # MLflow's usage telemetry posts to mlflow-telemetry.io: a local store's one network call
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow.tracking import MlflowClient

        uri, artifacts = mlflow_location(run_dir)
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(name, artifact_location=artifacts))
        if run_id is not None and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.run_id = run_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step)
                                                    for k, v in metrics.items()])

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_location(run_dir: str) -> tuple[str, str | None]:
    """(tracking URI, artifact location of a new experiment): `MLFLOW_TRACKING_URI` and the
    server's choice, else the SQLite store and artifact folder under `<run_dir>/mlruns`."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], None
    root = os.path.abspath(os.path.join(run_dir, "mlruns"))
    os.makedirs(root, exist_ok=True)
    return f"sqlite:///{root}/mlflow.db", f"file://{root}/artifacts"


class WandbTracker:
    """One W&B run, offline without a key (see the module docstring)."""

    def __init__(self, run_dir: str, run_name: str, run_id: str | None = None):
        import wandb

        folder, mode = os.environ.get("WANDB_DIR") or run_dir, wandb_mode()
        os.makedirs(folder, exist_ok=True)
        # The process's settings too: W&B's usage telemetry reads them, not the run's, and
        # would post to W&B's server from an offline run.
        wandb.setup(settings=wandb.Settings(mode=mode))
        self.run = wandb.init(
            mode=mode, dir=folder, name=run_name, id=run_id, resume="allow",
            project=os.environ.get("WANDB_PROJECT") or PROJECT, reinit="create_new",
            settings=wandb.Settings(console="off", save_code=False, silent=True,
                                    x_disable_stats=True))
        self.run_id = self.run.id

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: str) -> None:
        self.run.save(os.path.abspath(path), base_path=os.path.dirname(os.path.abspath(path)),
                      policy="now")

    def close(self) -> None:
        self.run.finish()


def wandb_mode() -> str:
    """`WANDB_MODE` when set, else online with an API key and offline without one."""
    return os.environ.get("WANDB_MODE") or ("online" if has_wandb_key() else "offline")


def has_wandb_key() -> bool:
    """Whether `WANDB_API_KEY` or the netrc file (`NETRC`, else ~/.netrc: where `wandb login`
    writes) holds a key for the W&B host (`WANDB_BASE_URL`, else api.wandb.ai)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class Trackers:
    """The chosen trackers as one: each call goes to every one of them."""

    def __init__(self, trackers: Mapping[str, Tracker]):
        self.trackers = dict(trackers)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log_config(self, config: Mapping[str, Any]) -> None:
        for tracker in self.trackers.values():
            tracker.log_config(config)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if metrics:
            for tracker in self.trackers.values():
                tracker.log_metrics(metrics, step)

    def log_artifact(self, path: str) -> None:
        for tracker in self.trackers.values():
            tracker.log_artifact(path)

    def log_files(self, files: Mapping[str, str]) -> None:
        """Texts (name -> content) as artifacts under those names."""
        if not self.trackers or not files:
            return
        with tempfile.TemporaryDirectory() as folder:
            for name, text in files.items():
                path = os.path.join(folder, os.path.basename(name))
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                self.log_artifact(path)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()

    def __enter__(self) -> Trackers:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trackers(names: Sequence[str], run_dir: str, run_name: str,
                  config: Mapping[str, Any] | None = None, resume: bool = False) -> Trackers:
    """A run named `run_name` in each tracker `names` chooses, with `config` logged. With
    `resume`, the runs whose ids `<run_dir>/trackers.json` keeps are continued."""
    chosen = check_names(names)
    if not chosen:
        return Trackers({})
    os.makedirs(run_dir, exist_ok=True)
    ids = _read_ids(run_dir) if resume else {}
    opened: dict[str, Tracker] = {}
    for name in chosen:
        if name == "tensorboard":
            opened[name] = TensorBoardTracker(run_dir)
        elif name == "mlflow":
            opened[name] = MlflowTracker(run_dir, run_name, ids.get(name))
        else:
            opened[name] = WandbTracker(run_dir, run_name, ids.get(name))
    kept = {n: t.run_id for n, t in opened.items() if hasattr(t, "run_id")}
    if kept:
        storage.atomic_write_json(os.path.join(run_dir, IDS_FILE), kept)
    trackers = Trackers(opened)
    if config is not None:
        trackers.log_config(config)
    return trackers


def local_dir(run_dir: str) -> str:
    """Where the trackers of a run in `run_dir` keep their files: there, or for a remote
    folder (gs://) the working folder (`MLFLOW_TRACKING_URI` and `WANDB_DIR` choose others)."""
    return "." if storage.is_remote(run_dir) else run_dir


def _read_ids(run_dir: str) -> dict[str, str]:
    path = os.path.join(run_dir, IDS_FILE)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except (ValueError, TypeError) as error:
        log.warning("%s: unreadable (%s); the trackers start new runs", path, error)
        return {}


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}, "c": [{"d": 2}]}` -> `{"a.b": 1, "c.0.d": 2}`: MLflow params are flat."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, f"{name}."))
        else:
            flat[name] = value
    return flat


def log_artifacts(trackers: Trackers, paths: Iterable[str]) -> None:
    """Each of `paths` that exists, as an artifact."""
    for path in paths:
        if path and os.path.exists(path):
            trackers.log_artifact(path)
