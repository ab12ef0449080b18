"""The report's warning for a task that did not learn (`finetune.baselines.note`), on the
numbers of a real run: the demo's tiny model on the sample's 300 MRPC rows as a task file (best
rate 3e-5: seeds 1 and 3 predict all 1, f1 83.04 / accuracy 71.00; seed 2 f1 83.53 / accuracy
72.00; the majority class scores 77.02)."""
from __future__ import annotations

import pytest

from finetune.baselines import Baseline, learned, note

MAJORITY = Baseline("majority class 1", {"accuracy": 0.71, "f1": 0.8304093567251462},
                    0.7702046783625731)
MEAN_OF_SEEDS = (0.7702046783625731 * 2 + (0.8353 + 0.72) / 2) / 3  # 77.27


def test_a_score_one_seed_lifts_above_the_baseline_is_flagged():
    assert learned(MEAN_OF_SEEDS, MAJORITY) is True  # beats it, by 0.25 points
    assert note("my-mrpc", MEAN_OF_SEEDS, MAJORITY, constant="", constant_runs=2, runs=3) == (
        "my-mrpc: 2 of 3 runs at the chosen rate predicted a constant; score 77.27 vs majority "
        "class 1 baseline 77.02: most runs did not learn the task (see docs/finetuning.md, "
        "'Small tasks and a task that learns nothing')")


@pytest.mark.parametrize("constant_runs, runs", [(1, 3), (0, 3), (1, 2), (0, 1)])
def test_a_task_most_of_whose_runs_learned_has_no_warning(constant_runs, runs):
    assert note("my-mrpc", MEAN_OF_SEEDS, MAJORITY, "", constant_runs, runs) == ""


def test_a_score_at_the_baseline_and_a_constant_best_run_say_the_run_did_not_learn():
    assert note("my-mrpc", MAJORITY.score, MAJORITY, "", 0, 3) == (
        "my-mrpc: score 77.02 is not above the baseline; score 77.02 vs majority class 1 "
        "baseline 77.02: the run did not learn the task (see docs/finetuning.md, 'Small tasks "
        "and a task that learns nothing')")
    assert note("my-mrpc", MAJORITY.score, MAJORITY, "all 1", 3, 3).startswith(
        "my-mrpc: predictions are constant (all 1); score 77.02 vs majority class 1 baseline "
        "77.02; 3 of 3 runs at the chosen rate predicted a constant: the run did not learn")
    assert note("my-mrpc", MEAN_OF_SEEDS, None, "all 1", 3, 3) == ""  # no baseline recorded
