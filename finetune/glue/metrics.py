"""GLUE metrics as the benchmark defines them, and the GLUE score.

CoLA: Matthews correlation; SST-2, QNLI, RTE, WNLI, MNLI-m/mm: accuracy; MRPC, QQP: F1 of the
positive class and accuracy; STS-B: Pearson and Spearman correlation. Values are fractions
(0.8 = 80 points); reports multiply by 100. A task's score is the unweighted mean of its metrics
(MNLI's are its matched and mismatched accuracy), and the GLUE score is the mean of task scores,
as the GLUE leaderboard computes them (Wang et al. 2019, section 4).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from finetune.glue.tasks import ACCURACY, F1, MCC, PEARSON, SPEARMAN, TaskSpec


def matthews_corr(labels: np.ndarray, predictions: np.ndarray) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(labels, predictions))


def f1(labels: np.ndarray, predictions: np.ndarray) -> float:
    """F1 of class 1 (paraphrase / duplicate), as GLUE scores MRPC and QQP."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
    from scipy.stats import pearsonr

    return _correlation(pearsonr, labels, predictions)


def spearman(labels: np.ndarray, predictions: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return _correlation(spearmanr, labels, predictions)


def _correlation(fn, labels: np.ndarray, predictions: np.ndarray) -> float:
    # A constant prediction (e.g. a collapsed regressor) has no defined correlation; score it 0
    # rather than NaN so model selection and averages stay defined.
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(fn(labels, predictions)[0])


METRIC_FUNCTIONS = {MCC: matthews_corr, ACCURACY: accuracy, F1: f1, PEARSON: pearson,
                    SPEARMAN: spearman}


def compute_metrics(task: TaskSpec, labels: Sequence, predictions: Sequence,
                    suffix: str = "") -> dict[str, float]:
    """The task's metrics on one dev split: {name + suffix: value}.

    `predictions` are class ids for classification tasks and scores for STS-B.
    """
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape or labels.ndim != 1 or len(labels) == 0:
        raise ValueError(f"{task.name}: labels {labels.shape} and predictions "
                         f"{predictions.shape} must be equal, non-empty 1-D arrays")
    return {f"{name}{suffix}": METRIC_FUNCTIONS[name](labels, predictions)
            for name in task.metrics}


def task_score(metrics: Mapping[str, float]) -> float:
    """A task's GLUE score: the unweighted mean of its metrics."""
    if not metrics:
        raise ValueError("task_score: no metrics")
    return float(np.mean(list(metrics.values())))


def glue_score(task_scores: Mapping[str, float]) -> float:
    """The GLUE score over the tasks given: the mean of their task scores."""
    if not task_scores:
        raise ValueError("glue_score: no task scores")
    return float(np.mean(list(task_scores.values())))
