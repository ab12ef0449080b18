"""SQuAD metrics equal the official scorers (../shared/peers/squad/evaluate-v1.1.py and
evaluate-v2.0.py, run as subprocesses, never copied) on real dev files with imperfect
predictions: every number they print, to its last digit."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from finetune.squad import data as squad_data
from finetune.squad.metrics import (
    best_threshold,
    normalize_answer,
    squad_v1_metrics,
    squad_v2_metrics,
    token_f1,
)
from tests.conftest import skip_or_fail


@pytest.fixture(scope="module")
def scorers(shared_data):
    folder = shared_data.parent / "peers" / "squad"
    if not (folder / "evaluate-v2.0.py").is_file():
        skip_or_fail(f"needs the official SQuAD scorers in {folder}")
    return folder


def official(scorer, data_path, predictions: dict, tmp_path, null_odds: dict | None = None
             ) -> dict:
    """What the official scorer prints for these predictions (its JSON)."""
    pred_file = tmp_path / "predictions.json"
    pred_file.write_text(json.dumps(predictions), encoding="utf-8")
    command = [sys.executable, str(scorer), str(data_path), str(pred_file)]
    if null_odds is not None:
        odds_file = tmp_path / "null_odds.json"
        odds_file.write_text(json.dumps(null_odds), encoding="utf-8")
        command += ["--na-prob-file", str(odds_file)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


def imperfect_predictions(examples, seed: int) -> dict[str, str]:
    """Answers as a half-trained model gives them: the gold, a gold with a word more or less,
    another span of the passage, a case/punctuation variant, or nothing."""
    rng = np.random.default_rng(seed)
    out = {}
    for e in examples:
        words = e.context.split()
        choice = rng.integers(6)
        if not e.answers or choice == 5:
            out[e.qid] = "" if rng.random() < 0.7 else " ".join(words[:rng.integers(1, 4)])
            continue
        gold = e.answers[rng.integers(len(e.answers))]
        if choice == 0:
            out[e.qid] = gold.text
        elif choice == 1:  # a word more on the right
            out[e.qid] = e.context[gold.start:].split(" ", gold.text.count(" ") + 2)
            out[e.qid] = " ".join(out[e.qid][:gold.text.count(" ") + 2])
        elif choice == 2:  # the first word only
            out[e.qid] = gold.text.split()[0]
        elif choice == 3:  # elsewhere in the passage
            i = rng.integers(len(words))
            out[e.qid] = " ".join(words[i:i + rng.integers(1, 6)])
        else:
            out[e.qid] = f"The {gold.text.upper()}."
    return out


def test_normalisation_and_f1():
    assert normalize_answer("  The  Denver-Broncos, an NFL team!") == "denverbroncos nfl team"
    assert normalize_answer("Theatre a") == "theatre"
    assert token_f1("Denver Broncos", "the Denver Broncos team", version_2=False) == 0.8
    assert token_f1("", ".", version_2=False) == 0.0
    assert token_f1("", ".", version_2=True) == 1.0
    assert token_f1("a", "", version_2=True) == 1.0  # both normalise to nothing


def test_v1_metrics_equal_the_official_scorer(scorers, shared_data, tmp_path):
    path = shared_data / "squad" / "dev-v1.1.json"
    examples = squad_data.read_squad(str(path), training=False, version_2=False).examples
    predictions = imperfect_predictions(examples, seed=0)
    ours = squad_v1_metrics(examples, predictions)
    theirs = official(scorers / "evaluate-v1.1.py", path, predictions, tmp_path)
    assert theirs == {"exact_match": pytest.approx(100 * ours["exact"], rel=1e-13, abs=0),
                      "f1": pytest.approx(100 * ours["f1"], rel=1e-13, abs=0)}
    assert round(theirs["exact_match"], 2) == 42.54 and round(theirs["f1"], 2) == 59.02
    # a missing prediction scores 0, an empty one matches the three golds that are just "."
    empty = squad_v1_metrics(examples, {e.qid: "" for e in examples[1:]})
    assert empty["exact"] * len(examples) == pytest.approx(3)


@pytest.mark.parametrize("name", ["dev-v2.0-cs224n.json", "dev-v2.0-normans-rhine.json"])
def test_v2_metrics_equal_the_official_scorer(scorers, shared_data, tmp_path, name):
    path = shared_data / "squad" / name
    examples = squad_data.read_squad(str(path), training=False, version_2=True).examples
    predictions = imperfect_predictions(examples, seed=1)
    rng = np.random.default_rng(2)  # odds that are higher, on the whole, for no-answer questions
    odds = {e.qid: float(rng.normal(1.0 if e.is_impossible else -1.0, 1.5)) for e in examples}
    ours = squad_v2_metrics(examples, predictions, odds)
    theirs = official(scorers / "evaluate-v2.0.py", path, predictions, tmp_path)
    searched = official(scorers / "evaluate-v2.0.py", path, predictions, tmp_path, odds)
    for key, value in theirs.items():
        mine = ours[key] if key.endswith("total") else 100 * ours[key]
        assert math.isclose(mine, value, rel_tol=1e-13), key
    for key in ("best_exact", "best_f1"):
        assert math.isclose(100 * ours[key], searched[key], rel_tol=1e-13), key
        assert ours[f"{key}_thresh"] == searched[f"{key}_thresh"], key
    assert sorted(theirs) == sorted(k for k in ours if not k.startswith("best"))


def test_best_threshold_walks_rising_odds():
    # two answerable questions (f1 1.0 and 0.5) and one unanswerable answered wrongly
    scores, odds = [1.0, 0.5, 0.0], [-2.0, 1.0, 0.5]
    has_answer, answered = [True, True, False], [True, True, True]
    # all null: 1/3; answer the first: 2/3; the third costs 1; the second gains .5
    assert best_threshold(scores, odds, has_answer, answered) == (2 / 3, -2.0)
    assert best_threshold([0.0], [3.0], [True], [True]) == (0.0, 0.0)
