"""Finished fine-tuning runs kept on disk: one small JSON file per (task, learning rate, seed)
under `<output>/runs/`, so a re-run with the same settings trains only the runs missing and a
crash (kill -9, a full disk, a diverging task after hours of others) loses only the run in
flight.

A run's file is named by a content hash (`common.storage.config_hash`, as the flow's stages)
of everything that decides the run:

- the checkpoint and tokenizer: the sha256 of each file loading reads (`bert_config.json` or
  `config.json`, the weights file, `tokenizer.json`/`vocab.txt`/`tokenizer_config.json`);
- the data: the family folder's files by relative path, size and modification time (a
  rewritten or touched file trains again; hashing GLUE's gigabyte per start would not pay);
- the task, its family and the family's settings (`pack_sequences`, `predict_test`);
- the loop's settings for the task (recipe and options) but the grid (`learning_rates`,
  `seeds`), `progress` and `report_to`, what its "auto" settings resolve to on this machine (the
  device type and bf16; the row length follows from the device), plus the run's own learning rate
  and seed;
- `RUN_FORMAT`, the version of what a run computes.

A diverged run is kept as diverged (the same settings diverge again). Each file is written
atomically; a file that cannot be read back (another version's) is trained again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from common import storage
from finetune.options import TaskJob, resolve_device, uses_bf16
from finetune.results import RunRecord, RunResult, TestPredictions
from model import hf

log = logging.getLogger(__name__)

RUNS_DIR = "runs"
"""The folder of the run files under a results folder."""
MODEL_FILES = (hf.CHECKPOINT_CONFIG, hf.CHECKPOINT_WEIGHTS, "config.json", *hf.HF_WEIGHT_FILES)
"""The checkpoint files `finetune.checkpoint.load_encoder` may read (model/hf.py's names)."""
RUN_FORMAT = 2
"""The version of what a run computes: raised when a change to the loop or a family changes a
run's result, so that runs kept before it train again."""
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
"""The files `finetune.checkpoint.load_tokenizer` may read."""
NOT_IN_KEY = ("learning_rates", "seeds", "progress", "report_to")
"""Loop settings that do not shape one run: the grid (each run keys its own rate and seed),
the progress bars and the experiment trackers."""


def model_identity(model_dir: str, tokenizer_dir: str) -> dict[str, dict[str, str]]:
    """{"model": {file: sha256}, "tokenizer": {file: sha256}} of the files present."""
    def hashes(folder: str, names: tuple[str, ...]) -> dict[str, str]:
        paths = {name: storage.join(folder, name) for name in names}
        return {name: storage.sha256_file(path) for name, path in paths.items()
                if storage.exists(path)}

    return {"model": hashes(model_dir, MODEL_FILES),
            "tokenizer": hashes(tokenizer_dir, TOKENIZER_FILES)}


def data_identity(data_dir: str) -> list[tuple[str, int, int]]:
    """(path below `data_dir`, size, mtime in ns) of every file under it, hidden ones aside."""
    listed = []
    for folder, dirs, files in os.walk(data_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = os.path.join(folder, name)
            stat = os.stat(path)
            listed.append((os.path.relpath(path, data_dir), stat.st_size, stat.st_mtime_ns))
    return listed


@dataclass(frozen=True)
class RunStore:
    """The run files of one task: `folder`/<task>-lr<rate>-seed<seed>-<hash>.json."""

    folder: str
    key: dict[str, Any]
    """What decides every run of the task but its learning rate and seed."""

    @classmethod
    def for_job(cls, folder: str, identity: dict, job: TaskJob) -> RunStore:
        """The store of `job`'s runs in `folder`; `identity` is `model_identity`'s."""
        family = (dataclasses.asdict(job.family) if dataclasses.is_dataclass(job.family)
                  else {})
        config = {k: v for k, v in dataclasses.asdict(job.config).items() if k not in NOT_IN_KEY}
        device = resolve_device(job.config.device)
        # what "auto" settings resolve to here: a CPU run (fp32, rows of 512) and a GPU run
        # (bf16, rows of max_seq_length) of the same settings are different runs
        resolved = {"device": device.type, "bf16": uses_bf16(job.config, device)}
        key = {"format": RUN_FORMAT, "checkpoint": identity, "data": data_identity(job.data_dir),
               "task": job.task, "family": job.family.name, "family_settings": family,
               "config": config, "resolved": resolved}
        return cls(folder, key)

    def path(self, learning_rate: float, seed: int) -> str:
        digest = storage.config_hash(self.run_key(learning_rate, seed))
        return storage.join(self.folder,
                            f"{self.key['task']}-lr{learning_rate:g}-seed{seed}-{digest}.json")

    def run_key(self, learning_rate: float, seed: int) -> dict[str, Any]:
        return {**self.key, "learning_rate": learning_rate, "seed": seed}

    def load(self, learning_rate: float, seed: int) -> RunRecord | None:
        """The finished run of (`learning_rate`, `seed`), or None when there is none."""
        path = self.path(learning_rate, seed)
        if not storage.exists(path):
            return None
        try:
            saved = storage.read_json(path)
            predictions = tuple(TestPredictions(**p | {"columns": tuple(p["columns"])})
                                for p in saved["predictions"])
            result = _in_metric_order(saved["result"], saved.get("metric_order", {}))
            return RunRecord(RunResult(**result), predictions)
        except (ValueError, TypeError, KeyError) as error:  # JSON or fields of another version
            log.warning("%s: unreadable (%s: %s); the run trains again", path,
                        type(error).__name__, error)
            return None

    def save(self, record: RunRecord, learning_rate: float, seed: int) -> str:
        """Keep `record` (atomically); returns its file."""
        path = self.path(learning_rate, seed)
        result = record.result
        storage.atomic_write_json(path, {
            "key": self.run_key(learning_rate, seed), "result": result,
            "predictions": list(record.predictions),
            "metric_order": {"metrics": list(result.metrics),
                             "baseline": list(result.baseline.metrics if result.baseline
                                              else {})}})
        return path


def _in_metric_order(result: dict, order: dict[str, list[str]]) -> dict:
    """A run's saved fields with its metrics (and its baseline's) in the order the family gave
    them, which the report's columns follow: JSON files here sort their keys."""
    def ordered(metrics: dict, names: list[str]) -> dict:
        return {name: metrics[name] for name in [*names, *sorted(set(metrics) - set(names))]
                if name in metrics}

    result = {**result, "metrics": ordered(result["metrics"], order.get("metrics", []))}
    if result.get("baseline"):
        result["baseline"] = {**result["baseline"], "metrics": ordered(
            result["baseline"]["metrics"], order.get("baseline", []))}
    return result
