"""Readers of what the experiment trackers wrote (training/trackers.py): the MLflow store under a
run folder, and W&B's offline run files, read record by record (wandb 0.31 ships no reader of
its `.wandb` files: they are LevelDB-log framed protobuf `Record`s, `wandb/proto`)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

_BLOCK = 32768
_HEADER = 7  # crc32 (4), length (2), kind (1): LevelDB's log format, as W&B writes it
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def no_tracker_account(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No MLflow server and no W&B key or settings from the machine: the local defaults."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_MODE",
                 "WANDB_DIR", "WANDB_PROJECT", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def mlflow_runs(run_dir: Path) -> list:
    """The runs of the `bert-dag` experiment in `<run_dir>/mlruns`, oldest first."""
    client = mlflow_client(run_dir)
    experiment = client.get_experiment_by_name("bert-dag")
    return sorted(client.search_runs([experiment.experiment_id]), key=lambda r: r.info.start_time)


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlruns/mlflow.db")


def wandb_records(run_folder: Path) -> list:
    """The protobuf records of an offline run folder's `run-<id>.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_folder.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, pos, parts = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if left < _HEADER or (kind == 0 and length == 0):  # a block's padding
            pos += left
            continue
        chunk = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        parts = chunk if kind in (_FULL, _FIRST) else parts + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def wandb_history(run_folder: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of every history row holding `key`."""
    rows = []
    for record in wandb_records(run_folder):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
            if key in items:
                rows.append((items["_step"], items[key]))
    return rows


def wandb_config(run_folder: Path) -> dict:
    """The run's config, every update applied in order."""
    config = {}
    for record in wandb_records(run_folder):
        kind = record.WhichOneof("record_type")
        updates = (record.run.config.update if kind == "run" else
                   record.config.update if kind == "config" else ())
        config.update({u.key: json.loads(u.value_json) for u in updates})
    return config


def wandb_saved_files(run_folder: Path) -> list[str]:
    """The files the run saved (`run.save`), by name."""
    return sorted(f.path for r in wandb_records(run_folder)
                  if r.WhichOneof("record_type") == "files" for f in r.files.files
                  if f.path != "requirements.txt")
