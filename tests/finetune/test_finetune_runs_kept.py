"""`bert-finetune` loses no finished work and refuses what it cannot fine-tune (issue 33, items 5
and 8): every (task, rate, seed) run kept in `<output>/runs/` and reused, a diverged run recorded
beside the finished ones, a failed run leaving an existing results folder as it was, a full disk
in one line with nothing that looks complete, a non-BERT or pickled checkpoint refused in one
line. Real MiniLM runs on 8 sample RTE rows; the subprocess tests run the command as users do.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from finetune.cli import main
from tests.conftest import REPO
from tests.support.disks import small_tmpfs

ERROR = "bert-finetune: error:"


@pytest.fixture
def rte_data(tmp_path) -> Path:
    """A data folder holding glue/RTE with the first 8 rows of the bundled sample's files."""
    from flows.config import SAMPLE

    folder = tmp_path / "data" / "glue" / "RTE"
    folder.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        lines = (SAMPLE / "glue" / "RTE" / name).read_text(encoding="utf-8").splitlines(True)
        (folder / name).write_text("".join(lines[:9]), encoding="utf-8")
    return tmp_path / "data"


@pytest.fixture(autouse=True)
def _threads_left_as_found():
    """`--num_threads 1` (runs in and out of this process add up in one order) sets torch's
    thread count for the whole process."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def argv(model: Path, data: Path, out: Path, rates: str, epochs: str = "1") -> list[str]:
    return ["--model", str(model), "--data", str(data), "--output", str(out), "--tasks", "rte",
            "--learning_rates", rates, "--seeds", "1", "--epochs", epochs, "--batch_size", "2",
            "--max_seq_length", "64", "--no_progress", "--num_threads", "1"]


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "finetune.cli", *args], cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def assert_one_error_line(done: subprocess.CompletedProcess, expected: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if line.startswith(ERROR)] == [expected]
    assert done.stderr.splitlines()[-1] == expected


def run_files(out: Path) -> list[Path]:
    return sorted((out / "runs").glob("*.json"))


def comparable(results: dict) -> list[dict]:
    """results.json's tasks without the timings."""
    timings = {"seconds", "train_seconds", "eval_seconds"}
    tasks = [{k: v for k, v in task.items() if k not in timings} for task in results["tasks"]]
    for task in tasks:
        task["runs"] = [{k: v for k, v in run.items() if k not in timings} for run in task["runs"]]
    return tasks


# ---------------------------------------------------------------------------------------------
# Finished runs are kept and reused
# ---------------------------------------------------------------------------------------------

def test_a_rerun_after_kill_9_trains_only_the_runs_missing(minilm_dir, rte_data, tmp_path,
                                                           caplog):
    """kill -9 while the second rate trains: the first rate's run file survives, a re-run
    reuses it (its file untouched, the log says so) and trains the second; the results equal
    an uninterrupted run's."""
    out = tmp_path / "killed"
    args = argv(minilm_dir, rte_data, out, "5e-5,4e-5")
    process = subprocess.Popen([sys.executable, "-m", "finetune.cli", *args], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 240
        while not run_files(out) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "the command ended before a run was kept"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    (first,) = run_files(out)  # the second run was in flight
    assert first.name.startswith("rte-lr5e-05-seed1-")
    assert sorted(p.name for p in out.iterdir()) == ["runs"]  # no report of an unfinished task
    mtime = first.stat().st_mtime_ns

    with caplog.at_level(logging.INFO, logger="finetune.loop"):
        assert main(args) == 0
    assert f"RTE lr=5e-05 seed=1: reused (finished) from {first}" in caplog.messages
    assert not any("lr=4e-05 seed=1: reused" in m for m in caplog.messages)
    assert first.stat().st_mtime_ns == mtime
    assert [p.name[:len("rte-lr4e-05-seed1-")] for p in run_files(out)] == [
        "rte-lr4e-05-seed1-", "rte-lr5e-05-seed1-"]

    whole = tmp_path / "uninterrupted"
    assert main(argv(minilm_dir, rte_data, whole, "5e-5,4e-5")) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert comparable(resumed) == comparable(json.loads((whole / "results.json").read_text()))
    assert [r["steps"] for r in resumed["tasks"][0]["runs"]] == [4, 4]
    assert (out / "submission" / "RTE.tsv").read_text() == \
        (whole / "submission" / "RTE.tsv").read_text()


def test_a_runs_file_is_keyed_by_what_decides_the_run(minilm_dir, rte_data, tmp_path):
    """Another epoch count, a touched data file or another checkpoint file is another run; the
    grid (the other rates and seeds) and the progress bars are not part of a run's key. A kept
    diverged run reads back as it was written."""
    from finetune.baselines import Baseline
    from finetune.glue import FAMILY
    from finetune.options import FinetuneConfig, TaskJob
    from finetune.results import RunRecord, RunResult
    from finetune.run_store import RunStore, model_identity

    identity = model_identity(str(minilm_dir), str(minilm_dir))
    assert sorted(identity["model"]) == ["config.json", "model.safetensors"]
    assert sorted(identity["tokenizer"]) == ["tokenizer.json", "tokenizer_config.json",
                                             "vocab.txt"]
    glue = str(rte_data / "glue")

    def path(cfg: FinetuneConfig, ident: dict = identity) -> str:
        return RunStore.for_job(str(tmp_path), ident, TaskJob(FAMILY, "rte", glue, cfg)).path(
            5e-5, 1)

    cfg = FinetuneConfig(learning_rates=(5e-5,), seeds=(1,), epochs=1.0)
    first = path(cfg)
    assert re.fullmatch(rf"{tmp_path}/rte-lr5e-05-seed1-[0-9a-f]{{16}}\.json", first)
    assert path(FinetuneConfig(learning_rates=(4e-5, 5e-5), seeds=(1, 2), epochs=1.0,
                               progress=False)) == first
    assert path(FinetuneConfig(learning_rates=(5e-5,), seeds=(1,), epochs=2.0)) != first
    assert path(cfg, identity | {"model": {**identity["model"], "config.json": "0" * 64}}) \
        != first
    train = rte_data / "glue" / "RTE" / "train.tsv"
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))
    assert path(cfg) != first

    store = RunStore.for_job(str(tmp_path), identity, TaskJob(FAMILY, "rte", glue, cfg))
    diverged = RunResult("RTE", 5e-5, 1, {}, float("nan"), 5, float("inf"), 1.5, 0.0,
                         status="diverged")
    assert store.load(5e-5, 1) is None
    store.save(RunRecord(diverged), 5e-5, 1)
    back = store.load(5e-5, 1)
    assert (back.result.status, back.result.steps, back.result.final_loss, back.predictions) \
        == ("diverged", 5, float("inf"), ())
    assert back.result.score != back.result.score  # NaN

    # metrics read back in the family's order, not the JSON file's sorted one: the report's
    # columns follow them
    scored = RunResult("RTE", 4e-5, 1, {"mcc": 0.1, "f1": 0.6, "accuracy": 0.55}, 0.55, 5,
                       0.7, 1.5, 0.2, baseline=Baseline("majority class 1",
                                                        {"mcc": 0.0, "f1": 0.67,
                                                         "accuracy": 0.5}, 0.5))
    store.save(RunRecord(scored), 4e-5, 1)
    back = store.load(4e-5, 1).result
    assert back == scored
    assert list(back.metrics) == list(back.baseline.metrics) == ["mcc", "f1", "accuracy"]


# ---------------------------------------------------------------------------------------------
# A diverged run is recorded; the others are kept
# ---------------------------------------------------------------------------------------------

def test_a_diverged_rate_is_recorded_and_a_task_that_only_diverges_changes_nothing(
        minilm_dir, rte_data, tmp_path, capsys):
    """Learning rate 1e4 beside 5e-5: the command ends well, the 1e4 run is "diverged" in
    runs.csv, results.json and the report, and 5e-5 is the chosen rate. A second command into
    that folder with 1e4 alone fails in one line (every run diverged), and leaves the folder's
    config.json and report as the first command wrote them, byte for byte."""
    out = tmp_path / "out"
    assert main(argv(minilm_dir, rte_data, out, "5e-5,1e4", epochs="2")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "RTE: 1 of 2 runs diverged (lr 10000 seed 1: loss nan at step 5); best_lr is chosen "
        "among the finished runs")
    rows = list(csv.DictReader((out / "runs.csv").read_text().splitlines()))
    assert [(r["learning_rate"], r["status"], r["chosen_lr"], r["steps"], r["final_loss"],
             r["score"] == "") for r in rows] == [
        ("5e-05", "finished", "1", "8", rows[0]["final_loss"], False),
        ("10000", "diverged", "0", "5", "nan", True)]
    results = json.loads((out / "results.json").read_text())
    (task,) = results["tasks"]
    assert task["best_learning_rate"] == 5e-5
    assert [(r["status"], r["score"], r["final_loss"], r["metrics"]) for r in task["runs"]][1] \
        == ("diverged", None, None, {})
    assert task["score"] == task["runs"][0]["score"]
    assert "RTE: 1 of 2 runs diverged" in (out / "summary.md").read_text()

    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"config.json", "results.json", "summary.md", "runs.csv"} <= set(before)
    assert main(argv(minilm_dir, rte_data, out, "1e4", epochs="2")) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR)]
    assert errors == [(f"{ERROR} RTE: every run diverged (learning rates 10000; seeds 1); "
                       "lower the learning rates")]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


# ---------------------------------------------------------------------------------------------
# Checkpoints that are not BERT's, or not plain tensors: one line
# ---------------------------------------------------------------------------------------------

def checkpoint_copy(minilm_dir: Path, folder: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).symlink_to(minilm_dir / name)
    return folder


def test_a_config_of_another_model_type_is_refused_in_one_line(minilm_dir, rte_data, tmp_path):
    model = checkpoint_copy(minilm_dir, tmp_path / "gpt2",
                            ("model.safetensors", "tokenizer.json", "tokenizer_config.json"))
    config = json.loads((minilm_dir / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    done = run_command(*argv(model, rte_data, tmp_path / "out", "5e-5"))
    assert_one_error_line(done, f"{ERROR} {model}/config.json: model_type 'gpt2', not one of "
                                "bert, modernbert")
    assert not (tmp_path / "out").exists()


def test_a_pickled_checkpoint_is_refused_in_one_line(minilm_dir, rte_data, tmp_path):
    """A pytorch_model.bin that torch.load(weights_only=True) refuses (a whole pickled module
    here): refused, never unpickled in full."""
    model = checkpoint_copy(minilm_dir, tmp_path / "pickled",
                            ("config.json", "tokenizer.json", "tokenizer_config.json"))
    torch.save(torch.nn.Linear(2, 2), model / "pytorch_model.bin")
    done = run_command(*argv(model, rte_data, tmp_path / "out", "5e-5"))
    assert_one_error_line(done, (
        f"{ERROR} {model}/pytorch_model.bin: not a plain state dict of tensors, refused by "
        "torch.load(weights_only=True) (unpickling more could run code); save the weights as "
        "model.safetensors"))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# A full disk
# ---------------------------------------------------------------------------------------------

DISK = 32 * 1024
"""A tmpfs with room for the run file (one 4 KiB page) but not the report (the plot alone is
~37 KB)."""


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 32 KiB tmpfs mounted for the test (unmounted after it)."""
    with small_tmpfs(tmp_path, f"{DISK // 1024}k") as mount:
        yield mount


def test_a_full_disk_is_one_line_and_leaves_no_report(minilm_dir, rte_data, small_disk,
                                                      caplog):
    """The report does not fit: one line naming the file and the space; no summary.md or
    runs.csv without results.json (no report file at all), the finished run kept; with room
    again, a re-run reuses that run and writes the report."""
    out = small_disk / "out"
    args = argv(minilm_dir, rte_data, out, "5e-5")
    done = run_command(*args)
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(ERROR)]
    assert re.fullmatch(rf"{ERROR} no space left on the device writing {out}/dev_scores\.png: "
                        r"it needs \d+\.\d KB, \d+\.\d KB left there", line), line
    assert_one_error_line(done, line)
    (kept,) = run_files(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["runs", f"runs/{kept.name}"]

    subprocess.run(["mount", "-o", "remount,size=1m", str(small_disk)], check=True)
    with caplog.at_level(logging.INFO, logger="finetune.loop"):
        assert main(args) == 0
    assert any(m.startswith("RTE lr=5e-05 seed=1: reused (finished)") for m in caplog.messages)
    assert {"results.json", "summary.md", "runs.csv", "config.json"} <= \
        {p.name for p in out.iterdir()}


def test_test_sets_are_predicted_once_per_rate_at_most_and_by_the_best_run(
        minilm_dir, rte_data, tmp_path, monkeypatch):
    """2 rates x 2 seeds: the test sets are predicted when a rate's seeds are done and its best
    seed is the best run so far (once or twice here, never per run), and the submission is the
    best run's, as an uninterrupted run with a single kept copy of the weights would give."""
    from finetune import loop
    calls = []
    predict = loop.predict_test_sets
    monkeypatch.setattr(loop, "predict_test_sets",
                        lambda *a, **k: calls.append(1) or predict(*a, **k))
    out = tmp_path / "grid"
    args = [*argv(minilm_dir, rte_data, out, "5e-5,1e-5")]
    args[args.index("--seeds") + 1] = "1,2"
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    (task,) = results["tasks"]
    assert len(task["runs"]) == 4 and 1 <= len(calls) <= 2
    kept = [json.loads(p.read_text()) for p in run_files(out)]
    predicted = [k["result"] for k in kept if k["predictions"]]
    assert len(predicted) == len(calls)
    best = max((r for r in task["runs"] if r["learning_rate"] == task["best_learning_rate"]),
               key=lambda r: r["score"])
    assert (best["learning_rate"], best["seed"]) in {(r["learning_rate"], r["seed"])
                                                    for r in predicted}
    assert (out / "submission" / "RTE.tsv").exists()
