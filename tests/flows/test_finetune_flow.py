"""The flow's fine-tuning fan-out over several families: GLUE and the toy family of
tests/support/toy_family.py, registered as a family package is (one line in finetune.tasks.FAMILIES)."""
from __future__ import annotations

import json

import pytest

from finetune import tasks
from flows import finetune_runs
from flows.config import SAMPLE, check_inputs_exist, resolve
from flows.stages import StageResult
from tests.support.toy_family import save_toy_checkpoint


@pytest.fixture
def with_toy_family(monkeypatch):
    monkeypatch.setitem(tasks.FAMILIES, "toy", "tests.support.toy_family")


def _data(root):
    rte = root / "glue" / "RTE"
    rte.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        lines = (SAMPLE / "glue" / "RTE" / name).read_text(encoding="utf-8").splitlines(True)
        (rte / name).write_text("".join(lines[:9]), encoding="utf-8")
    (root / "toy").mkdir()
    return root


def test_the_fan_out_covers_every_family_and_merges_the_tables(with_toy_family, tmp_path):
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "finetune": {
        "data": str(_data(tmp_path / "data")), "tasks": "rte,toy", "learning_rates": [1e-3],
        "seeds": [1, 2], "epochs": 1, "batch_size": 4, "max_seq_length": 32}})
    jobs = finetune_runs.finetune_jobs(cfg)
    # "toy" is the family: its two tasks; its large task runs the first seed only
    assert [(j.family, j.task, j.seed) for j in jobs] == [
        ("glue", "rte", 1), ("glue", "rte", 2), ("toy", "small", 1), ("toy", "small", 2),
        ("toy", "large", 1)]
    model = StageResult("export", str(save_toy_checkpoint(tmp_path / "model")), "toy",
                        cached=False, seconds=0.0)
    outcomes = [finetune_runs.finetune_run(cfg, model, job) for job in jobs]
    assert not any(o["cached"] for o in outcomes)
    summary = finetune_runs.finetune_best(cfg, model, outcomes)
    assert summary["failed"] == []
    table = summary["table"]
    for row in ("| RTE | accuracy", "| small | accuracy", "| large | accuracy", "| GLUE score |"):
        assert row in table
    out = tmp_path / "run" / "finetune"
    results = json.loads((out / "results.json").read_text())
    assert [(t["task"], t["family"], t["seeds"]) for t in results["tasks"]] == [
        ("RTE", "glue", [1, 2]), ("small", "toy", [1, 2]), ("large", "toy", [1])]
    assert results["glue_score"] == results["tasks"][0]["score"]
    assert json.loads((out / "small" / "predictions.json").read_text()) == list(range(10))
    assert (out / "submission.zip").is_file()  # GLUE's test predictions
    # each run is a content-addressed stage: a second fan-out reuses every one
    assert all(finetune_runs.finetune_run(cfg, model, job)["cached"] for job in jobs)


def test_a_missing_family_folder_is_named_before_any_stage(with_toy_family, tmp_path):
    data = _data(tmp_path / "data")
    (data / "toy").rmdir()
    cfg = resolve("tiny", {"finetune": {"data": str(data), "tasks": "rte,small,large"}})
    with pytest.raises(FileNotFoundError) as error:
        check_inputs_exist(cfg)
    assert str(error.value) == (f"setting finetune.data={str(data)!r}: no toy/ folder (for "
                                "small, large)")
    check_inputs_exist(cfg, data_only=True)  # a data-only run reads no fine-tuning data
