"""A dev set sliced by `max_eval_examples` gives a predictions.json that says it is partial:
a warning and PARTIAL.txt beside it, the file itself still the official scorer's mapping."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from finetune.checkpoint import load_tokenizer
from finetune.report import TABLE_COLUMNS
from finetune.squad import FAMILY
from finetune.squad import data as squad_data
from finetune.squad.family import PARTIAL_FILE, partial_note

SAMPLE = "data/sample"


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return load_tokenizer(str(minilm_dir))


def _zero_scored(prepared):
    shape = (len(prepared.dev["dev"]), 384)
    return FAMILY.score(prepared, "dev", {"start_logits": np.zeros(shape, np.float32),
                                          "end_logits": np.zeros(shape, np.float32)})


def test_sliced_dev_predictions_say_they_are_partial(tokenizer, caplog):
    total = len(squad_data.read_squad(squad_data.split_path(SAMPLE, "squad1", "dev"),
                                      training=False, version_2=False).examples)
    prepared = FAMILY.prepare("squad1", SAMPLE, tokenizer, 384, max_train_examples=4,
                              max_eval_examples=5, skip_bad_records=False)
    with caplog.at_level(logging.WARNING, logger="finetune.squad.family"):
        scored = _zero_scored(prepared)
    note = f"partial (5 of {total} questions): not for submission"
    assert scored.files[PARTIAL_FILE] == note + "\n"
    assert f"squad1 dev predictions.json: {note}" in caplog.text
    predictions = json.loads(scored.files["predictions.json"])
    assert len(predictions) == 5 and all(isinstance(v, str) for v in predictions.values())


def test_whole_dev_set_is_not_partial(tokenizer):
    prepared = FAMILY.prepare("squad1", SAMPLE, tokenizer, 384, max_train_examples=4,
                              max_eval_examples=None, skip_bad_records=False)
    assert PARTIAL_FILE not in _zero_scored(prepared).files
    assert (partial_note(7, 7), partial_note(3, 7)) == (
        "", "partial (3 of 7 questions): not for submission")


def test_a_sliced_run_says_partial_in_its_report_row_and_on_the_console(minilm_dir, tmp_path,
                                                                         capsys):
    """A real `bert-finetune` run on a slice of the sample's dev set: the row, the line under
    the table (summary.md and stdout alike), results.csv and results.json say it is partial."""
    from finetune.cli import main

    total = len(squad_data.read_squad(squad_data.split_path(SAMPLE, "squad1", "dev"),
                                      training=False, version_2=False).examples)
    out = tmp_path / "out"
    assert main(["--model", str(minilm_dir), "--data", SAMPLE, "--output", str(out),
                 "--tasks", "squad1", "--learning_rates", "5e-5", "--seeds", "1",
                 "--epochs", "1", "--batch_size", "4", "--max_seq_length", "128",
                 "--max_train_examples", "4", "--max_eval_examples", "3", "--no_progress",
                 "--device", "cpu"]) == 0
    note = f"partial (3 of {total} questions): not for submission"
    line = f"squad1: predictions are {note}"
    table = (out / "summary.md").read_text()
    (row,) = [r for r in table.splitlines() if r.startswith("| squad1 |")]
    assert row.split(" | ")[TABLE_COLUMNS.index("dev_examples")] == "3 (partial)"
    assert table.endswith(f"\n\n{line}\n")
    assert capsys.readouterr().out == table
    summary = dict(zip(*[r.split(",") for r in
                         (out / "results.csv").read_text().splitlines()[:2]]))
    assert summary["dev_examples"] == "3 (partial)"
    (result,) = json.loads((out / "results.json").read_text())["tasks"]
    assert result["partial"] == note
    assert (out / "squad1" / PARTIAL_FILE).read_text() == note + "\n"
