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
  store it keeps up; read it with `MlflowClient(tracking_uri=...)`, or with the full `mlflow`
  package's `mlflow ui --backend-store-uri sqlite:///<run_dir>/mlruns/mlflow.db` (the extra
  installs `mlflow-skinny`, which has no UI). Experiment: `MLFLOW_EXPERIMENT_NAME`, else `bert-dag`.
  MLflow's usage telemetry is off unless `MLFLOW_DISABLE_TELEMETRY=false`.
- wandb: `WANDB_MODE` when set; else online with a key (`WANDB_API_KEY`, or a `wandb login`
  entry in the netrc file) and offline without one, which makes no network call (W&B's usage
  telemetry included: it follows the process's settings, `wandb.setup`) and leaves the
  run in `<WANDB_DIR or run_dir>/wandb/offline-run-*` (`wandb sync` uploads it later). Project:
  `WANDB_PROJECT`, else `bert-dag`.

Resuming (`resume=True`): the MLflow run id and the W&B run id are kept in
`<run_dir>/trackers.json`, so a resumed pre-training run continues the same MLflow run and the
same W&B run id (offline, W&B writes one run folder per process, each with that id). A
resumed MLflow run keeps the parameters it was given (MLflow refuses to change one): a value
a resume changes (`cadence.log_every`, ...) is a tag `resumed.<name>`. The steps between the
checkpoint resumed from and the kill are logged again: MLflow
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
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

from common import settings, storage
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

    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None: ...

    def log_artifact(self, path: str) -> None: ...

    def close(self, failed: bool = False) -> None: ...


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

    def __init__(self, run_dir: str, subfolder: str = ""):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard", subfolder))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")

    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None:
        walltime = None if timestamp_ms is None else timestamp_ms / 1000
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step, walltime=walltime)
        self.writer.flush()

    def log_artifact(self, path: str) -> None:
        pass

    def close(self, failed: bool = False) -> None:
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
        experiment_id = self._experiment(name, artifacts)
        if run_id is not None and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.run_id = run_id

    def _experiment(self, name: str, artifacts: str | None) -> str:
        """The experiment's id, made where missing; one that another run (a parallel
        fine-tuning run on the same store) made meanwhile is looked up again."""
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param, RunTag

        logged = self.client.get_run(self.run_id).data.params
        values = {k: str(v)[:6000] for k, v in settings.dotted(config, items=True).items()}
        params = [Param(k, v) for k, v in values.items() if k not in logged]
        tags = [RunTag(f"resumed.{k}", v) for k, v in values.items()
                if k in logged and logged[k] != v]
        for start in range(0, max(len(params), len(tags)), 100):  # at most 100 a batch
            self.client.log_batch(self.run_id, params=params[start:start + 100],
                                  tags=tags[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric

        # a value logged again with its own timestamp is one point (MLflow drops the repeat)
        when = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), when, step)
                                                    for k, v in metrics.items()])

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


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

    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None:
        self.run.log(dict(metrics), step=step)  # W&B times a step itself

    def log_artifact(self, path: str) -> None:
        self.run.save(os.path.abspath(path), base_path=os.path.dirname(os.path.abspath(path)),
                      policy="now")

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


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
    """The chosen trackers as one: each call goes to every one of them. A tracker is a witness,
    never a reason to stop: one that fails (a tracking server gone, a full disk under its
    store) is warned about once and dropped, and the run goes on (on rank 0 of a multi-rank
    run, a raise would leave the other ranks waiting at their next collective)."""

    def __init__(self, trackers: Mapping[str, Tracker]):
        self.trackers = dict(trackers)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, action: str, call) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as error:  # noqa: BLE001 (any tracker failure: see the class)
                log.warning("report_to %s: %s failed (%s: %s); its logging stops here", name,
                            action, type(error).__name__, str(error).splitlines()[0][:200])
                self.trackers.pop(name, None)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each("logging the config", lambda t: t.log_config(config))

    def log_metrics(self, metrics: Mapping[str, float], step: int,
                    timestamp_ms: int | None = None) -> None:
        """`timestamp_ms`: when the values were measured (default now); a value logged again
        with the same one stays one point in MLflow."""
        if metrics:
            self._each("logging metrics", lambda t: t.log_metrics(metrics, step, timestamp_ms))

    def log_artifact(self, path: str) -> None:
        self._each(f"logging {os.path.basename(path)}", lambda t: t.log_artifact(path))

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

    def close(self, failed: bool = False) -> None:
        """End every run, FAILED where `failed` (a crashed or diverged run), else FINISHED."""
        self._each("closing", lambda t: t.close(failed))
        self.trackers = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=kind is not None)


def open_trackers(names: Sequence[str], run_dir: str, run_name: str,
                  config: Mapping[str, Any] | None = None, resume: bool = False,
                  tensorboard_subfolder: str = "", ids_file: str | None = None) -> Trackers:
    """A run named `run_name` in each tracker `names` chooses, with `config` logged. With
    `resume`, the runs whose ids `ids_file` (default `<run_dir>/trackers.json`) keeps are
    continued. `tensorboard_subfolder`: the run's folder under `<run_dir>/tensorboard/` where
    several runs share `run_dir` (the fine-tuning runs of a task grid), so their curves stay
    apart."""
    chosen = check_names(names)
    if not chosen:
        return Trackers({})
    os.makedirs(run_dir, exist_ok=True)
    ids_file = ids_file or os.path.join(run_dir, IDS_FILE)
    ids = _read_ids(ids_file) if resume else {}
    opened: dict[str, Tracker] = {}
    try:
        for name in chosen:
            try:
                opened[name] = _open(name, run_dir, run_name, ids.get(name),
                                     tensorboard_subfolder)
            except Exception as error:  # noqa: BLE001 (a witness, never a reason to stop)
                log.warning("report_to %s: the run is not tracked there (%s: %s)", name,
                            type(error).__name__, str(error).splitlines()[0][:200])
    except BaseException:
        Trackers(opened).close(failed=True)  # none of the runs half-opened is left RUNNING
        raise
    kept = {n: t.run_id for n, t in opened.items() if hasattr(t, "run_id")}
    if kept:
        storage.atomic_write_json(ids_file, kept)
    trackers = Trackers(opened)
    if config is not None:
        trackers.log_config(config)
    return trackers


def _open(name: str, run_dir: str, run_name: str, run_id: str | None,
          tensorboard_subfolder: str) -> Tracker:
    if name == "tensorboard":
        return TensorBoardTracker(run_dir, tensorboard_subfolder)
    if name == "mlflow":
        return MlflowTracker(run_dir, run_name, run_id)
    return WandbTracker(run_dir, run_name, run_id)


def local_dir(run_dir: str) -> str:
    """Where the trackers of a run in `run_dir` keep their files: there, or for a remote
    folder (gs://) the working folder (`MLFLOW_TRACKING_URI` and `WANDB_DIR` choose others)."""
    return "." if storage.is_remote(run_dir) else run_dir


def _read_ids(path: str) -> dict[str, str]:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f))
    except (ValueError, TypeError) as error:
        log.warning("%s: unreadable (%s); the trackers start new runs", path, error)
        return {}


def log_artifacts(trackers: Trackers, paths: Iterable[str]) -> None:
    """Each of `paths` that exists, as an artifact."""
    for path in paths:
        if path and os.path.exists(path):
            trackers.log_artifact(path)
