"""GLUE metrics: hand-computed cases, independent formulas, and the GLUE score."""
from __future__ import annotations

import math

import numpy as np
import pytest

from finetune.glue import metrics
from finetune.glue.tasks import TASKS

LABELS = np.array([1, 1, 0, 0, 1, 0, 1, 1])
PREDICTIONS = np.array([1, 0, 0, 1, 1, 0, 1, 0])
# TP = 3 (0, 4, 6), FN = 2 (1, 7), TN = 2 (2, 5), FP = 1 (3).


def test_hand_computed_classification():
    assert metrics.accuracy(LABELS, PREDICTIONS) == 5 / 8
    precision, recall = 3 / 4, 3 / 5
    assert metrics.f1(LABELS, PREDICTIONS) == pytest.approx(2 * precision * recall /
                                                            (precision + recall))  # 2/3
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (6 - 2) / sqrt(4*5*3*4)
    assert metrics.matthews_corr(LABELS, PREDICTIONS) == pytest.approx(4 / math.sqrt(240))
    assert metrics.matthews_corr(LABELS, LABELS) == 1.0
    assert metrics.matthews_corr(LABELS, 1 - LABELS) == -1.0
    # All one class predicted: MCC is 0 by convention (CoLA's majority baseline scores 0).
    assert metrics.matthews_corr(LABELS, np.ones_like(LABELS)) == 0.0
    # F1 counts class 1 only: predicting all 0 gives 0, not the F1 of class 0.
    assert metrics.f1(LABELS, np.zeros_like(LABELS)) == 0.0


def test_hand_computed_correlations():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    # cov = 3, |dx| = sqrt(2), |dy| = sqrt(42)/3  ->  r = 9 / sqrt(84)
    assert metrics.pearson(x, y) == pytest.approx(9 / math.sqrt(84))
    assert metrics.spearman(x, y) == pytest.approx(1.0)  # same order
    # ranks (1, 3, 2) vs (1, 2, 3): 1 - 6 * (0 + 1 + 1) / (3 * (9 - 1)) = 0.5
    assert metrics.spearman(x, np.array([0.1, 5.0, 2.0])) == pytest.approx(0.5)
    # Ties take average ranks: (1, 2.5, 2.5) vs (1, 2, 3) -> Pearson of the ranks.
    assert metrics.spearman(x, np.array([0.0, 1.0, 1.0])) == pytest.approx(
        np.corrcoef([1, 2.5, 2.5], [1, 2, 3])[0, 1])
    # A constant regressor has no correlation: 0, not NaN.
    assert metrics.pearson(x, np.full(3, 2.5)) == 0.0
    assert metrics.spearman(x, np.full(3, 2.5)) == 0.0


def test_against_reference_libraries_on_random_data():
    from scipy.stats import pearsonr, rankdata, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    predictions = np.where(rng.random(500) < 0.7, labels, 1 - labels)
    assert metrics.accuracy(labels, predictions) == accuracy_score(labels, predictions)
    assert metrics.f1(labels, predictions) == f1_score(labels, predictions)
    assert metrics.matthews_corr(labels, predictions) == matthews_corrcoef(labels, predictions)
    # Independent formulas: MCC from the confusion matrix, F1 from counts.
    tp = int(((labels == 1) & (predictions == 1)).sum())
    tn = int(((labels == 0) & (predictions == 0)).sum())
    fp = int(((labels == 0) & (predictions == 1)).sum())
    fn = int(((labels == 1) & (predictions == 0)).sum())
    assert metrics.matthews_corr(labels, predictions) == pytest.approx(
        (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    assert metrics.f1(labels, predictions) == pytest.approx(2 * tp / (2 * tp + fp + fn))

    scores = rng.uniform(0, 5, 300).round(1)  # ties, as STS-B's 0.2-step gold scores
    guesses = scores + rng.normal(0, 1.0, 300)
    assert metrics.pearson(scores, guesses) == pytest.approx(pearsonr(scores, guesses)[0])
    assert metrics.pearson(scores, guesses) == pytest.approx(np.corrcoef(scores, guesses)[0, 1])
    assert metrics.spearman(scores, guesses) == pytest.approx(spearmanr(scores, guesses)[0])
    assert metrics.spearman(scores, guesses) == pytest.approx(
        np.corrcoef(rankdata(scores), rankdata(guesses))[0, 1])


def test_compute_metrics_per_task():
    assert metrics.compute_metrics(TASKS["MRPC"], LABELS, PREDICTIONS) == {
        "f1": pytest.approx(2 / 3), "accuracy": 5 / 8}
    assert list(metrics.compute_metrics(TASKS["QQP"], LABELS, PREDICTIONS)) == ["f1", "accuracy"]
    assert metrics.compute_metrics(TASKS["CoLA"], LABELS, PREDICTIONS) == {
        "mcc": pytest.approx(4 / math.sqrt(240))}
    for name in ("SST-2", "QNLI", "RTE", "WNLI"):
        assert metrics.compute_metrics(TASKS[name], LABELS, PREDICTIONS) == {"accuracy": 5 / 8}
    assert metrics.compute_metrics(TASKS["MNLI"], [0, 1, 2, 2], [0, 1, 1, 2], suffix="_mm") == {
        "accuracy_mm": 0.75}
    stsb = metrics.compute_metrics(TASKS["STS-B"], [1.0, 2.0, 3.0], [1.0, 2.0, 4.0])
    assert stsb == {"pearson": pytest.approx(9 / math.sqrt(84)), "spearman": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="MRPC: labels"):
        metrics.compute_metrics(TASKS["MRPC"], [0, 1], [0, 1, 1])


def test_task_and_glue_scores():
    # A task with two metrics contributes their mean (MRPC, QQP, STS-B; MNLI m/mm).
    assert metrics.task_score({"f1": 0.9, "accuracy": 0.8}) == pytest.approx(0.85)
    assert metrics.task_score({"accuracy_m": 0.84, "accuracy_mm": 0.83}) == pytest.approx(0.835)
    assert metrics.task_score({"mcc": 0.5}) == 0.5
    # BERT-base's GLUE test numbers (paper table 1) without WNLI/AX: the mean of task scores.
    tasks = {"MNLI": (84.6 + 83.4) / 2, "QQP": 71.2, "QNLI": 90.5, "SST-2": 93.5, "CoLA": 52.1,
             "STS-B": 85.8, "MRPC": 88.9, "RTE": 66.4}
    assert metrics.glue_score(tasks) == pytest.approx(79.05)
    with pytest.raises(ValueError):
        metrics.glue_score({})
