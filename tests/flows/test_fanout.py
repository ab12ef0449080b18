"""The flow's fine-tuning fan-out: tasks, rates and seeds, one free device per run, one preparation
per task, bad rows set aside, the tokenizer checked against the model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flows import devices, finetune_runs
from flows.config import resolve


def test_glue_fan_out_covers_tasks_rates_and_seeds_for_small_tasks():
    cfg = resolve("tiny", {"finetune": {"tasks": ["rte", "sst-2"],
                                        "learning_rates": [1e-4, 5e-5], "seeds": [1, 2]}})
    jobs = finetune_runs.finetune_jobs(cfg)
    # RTE is a small task (seeds x rates); SST-2 is not (first seed only).
    assert [(j.family, j.task, j.learning_rate, j.seed) for j in jobs] == [
        ("glue", "rte", 1e-4, 1), ("glue", "rte", 1e-4, 2), ("glue", "rte", 5e-5, 1),
        ("glue", "rte", 5e-5, 2), ("glue", "sst-2", 1e-4, 1), ("glue", "sst-2", 5e-5, 1)]
    # a family name is all its tasks; the recipe fills what is not set
    every = resolve("tiny", {"finetune": {"tasks": ["glue"], "learning_rates": [],
                                          "epochs": None, "seeds": [1]}})
    assert len(finetune_runs.finetune_jobs(every)) == 9 * 4


def test_fine_tuning_runs_take_a_free_device_one_run_each():
    """GLUE runs mapped on Prefect's threads borrow a device from the pool: each device serves
    one run at a time, and a run waits only while every device is taken."""
    import threading

    import torch

    assert devices.fine_tuning_devices(num_gpus=2) == ["cuda:0", "cuda:1"]
    assert devices.fine_tuning_devices(num_gpus=0) == ["cpu"]
    if not torch.cuda.is_available():
        assert devices.fine_tuning_devices() == ["cpu"]
    pool = devices.DevicePool(["cuda:0", "cuda:1"])
    third: list[str] = []

    def run() -> None:
        with pool.take() as device:
            third.append(device)

    with pool.take() as first, pool.take() as second:
        assert {first, second} == {"cuda:0", "cuda:1"}
        waiting = threading.Thread(target=run)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not third  # both devices lent: the third run waits
    waiting.join(10)
    assert third in (["cuda:0"], ["cuda:1"])  # and gets one once they are back


def test_runs_of_one_task_share_one_preparation():
    """The fan-out's threads tokenize a task once: runs that ask while it is being read wait
    for that reading and get the same object; another task is prepared on its own; a task no
    run holds any more is freed, and read again if asked for."""
    import gc
    import threading

    shared = finetune_runs.SharedPreparations()
    builds: list[str] = []
    reading = threading.Event()
    release = threading.Event()

    def build(name: str, slow: bool):
        def read():
            builds.append(name)
            if slow:  # the other runs of the task arrive while it is read
                reading.set()
                release.wait(30)
            return finetune_runs._Prepared(encoder=name, prepared=[name])
        return read

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(shared.get("MRPC", build("MRPC", True))))
               for _ in range(3)]
    for t in threads:
        t.start()
    assert reading.wait(10)
    others: list = []
    rte = threading.Thread(target=lambda: others.append(shared.get("RTE", build("RTE", False))))
    rte.start()
    rte.join(10)  # not blocked behind MRPC's reading, which is still going on
    assert not rte.is_alive() and others[0].encoder == "RTE" and not got
    release.set()
    for t in threads:
        t.join(10)
    assert builds == ["MRPC", "RTE"]
    assert len(got) == 3 and got[0] is got[1] is got[2]
    del got[:], others[:]
    gc.collect()
    shared.get("MRPC", build("MRPC", False))
    assert builds == ["MRPC", "RTE", "MRPC"]

    # A failed reading fails the runs waiting for it without reading again ...
    failing, fail = threading.Event(), threading.Event()

    def malformed():
        builds.append("CoLA")
        failing.set()
        fail.wait(30)
        raise ValueError("CoLA/train.tsv line 7: 3 fields, expected 4")

    errors: list[str] = []

    def run() -> None:
        try:
            shared.get("CoLA", malformed)
        except (ValueError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {e}")

    cola = [threading.Thread(target=run) for _ in range(3)]
    cola[0].start()
    assert failing.wait(10)
    for t in cola[1:]:
        t.start()
    deadline = time.monotonic() + 10
    while shared._keys["CoLA"].waiting < 3:  # the other two wait on CoLA's key
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fail.set()
    for t in cola:
        t.join(10)
    assert builds.count("CoLA") == 1 and len(errors) == 3
    assert max(errors) == "ValueError: CoLA/train.tsv line 7: 3 fields, expected 4"
    assert all(e.startswith("RuntimeError: ValueError: CoLA/train.tsv line 7") for e in
               sorted(errors)[:2])
    # ... and a run that comes after them reads the (now fixed) task again
    assert shared.get("CoLA", build("CoLA", False)).encoder == "CoLA"


def _glue_fan_out(cfg, model_dir: Path) -> dict:
    """The flow's fine-tuning steps (each job, then the best), run in this process."""
    from flows.stages import StageResult

    model = StageResult("export", str(model_dir), "test", cached=False, seconds=0.0)
    return finetune_runs.finetune_best(cfg, model, [finetune_runs.finetune_run(cfg, model, job)
                                            for job in finetune_runs.finetune_jobs(cfg)])


def test_glue_fan_out_sets_bad_rows_aside_in_the_dead_letter_file(shared_data, minilm_dir,
                                                                  tmp_path, caplog):
    """finetune.skip_bad_rows: the flow writes the rows set aside (file, line, reason, text) to
    finetune/dead_letter/ as bert-glue does; without it the run fails naming the file and
    line."""
    from tests.support.glue_fixtures import glue_slice

    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 8, "RTE/dev.tsv": 4})
    train = (data / "RTE" / "train.tsv").read_text(encoding="utf-8").split("\n")
    train[2] = train[2].rsplit("\t", 1)[0] + "\tentailed"  # line 3: unknown label
    (data / "RTE" / "train.tsv").write_text("\n".join(train), encoding="utf-8")
    glue = {"data": str(tmp_path), "tasks": ["rte"], "learning_rates": [1e-4], "seeds": [1],
            "epochs": 0.5}
    strict = resolve("tiny", {"output": str(tmp_path / "strict"), "finetune": glue})
    path = data / "RTE" / "train.tsv"
    with pytest.raises(ValueError, match=f"{path}:3: label 'entailed' is not one of"):
        _glue_fan_out(strict, minilm_dir)

    cfg = resolve("tiny", {"output": str(tmp_path / "run"),
                           "finetune": {**glue, "skip_bad_rows": "true"}})
    summary = _glue_fan_out(cfg, minilm_dir)
    dead_letter = tmp_path / "run" / "finetune" / "dead_letter" / "glue_bad_rows.jsonl"
    assert summary["files"]["dead_letter"] == str(dead_letter)
    assert [json.loads(line) for line in dead_letter.read_text(encoding="utf-8").splitlines()] == [
        {"task": "RTE", "file": str(path), "record": "line 3", "text": train[2],
         "reason": "label 'entailed' is not one of ['entailment', 'not_entailment']"}]
    results = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    assert (results["bad_rows"], results["tasks"][0]["num_train_examples"]) == (1, 7)
    assert ("fine-tuning: 1 malformed record(s) set aside (finetune.skip_bad_rows) in "
            f"{dead_letter}" in caplog.messages)


def test_glue_fan_out_checks_the_tokenizer_against_the_model(shared_data, minilm_dir, tmp_path):
    """A model folder whose vocabulary has ids the model cannot embed fails before training
    with the check bert-glue runs, not with an IndexError deep in torch."""
    from tests.support.glue_fixtures import glue_slice

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model_dir / name).symlink_to(minilm_dir / name)
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (model_dir / "vocab.txt").write_text("\n".join([*vocab, "newtoken"]) + "\n", encoding="utf-8")
    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 4, "RTE/dev.tsv": 4})
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "finetune": {
        "data": str(data.parent), "tasks": ["rte"], "learning_rates": [1e-4], "seeds": [1]}})
    with pytest.raises(ValueError, match=f"tokenizer of {model_dir} gives token ids up to 30522 "
                                         f"\\(30523 ids\\) but the model {model_dir} has "
                                         "vocab_size 30522"):
        _glue_fan_out(cfg, model_dir)
