"""The official SQuAD metrics: exact match and token F1, max over the gold answers.

Answers are normalised as the official scorers do (lower case, punctuation dropped, the
articles a/an/the dropped, whitespace collapsed). v1.1 and v2.0 differ in one place: when the
normalised prediction or gold answer is empty, v1.1's F1 is 0 and v2.0's is 1 if both are empty.
v2.0 also scores "" against unanswerable questions, splits HasAns/NoAns, and finds the
no-answer threshold that maximises each metric (`best_threshold`, the scorer's
`find_best_thresh`). Metrics are fractions; the scorers print them x100.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from finetune.squad.data import SquadExample

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop articles, collapse whitespace (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version_2: bool) -> float:
    """Harmonic mean of token precision and recall of the normalised answers."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)  # no-answer: right only when both are empty
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class QuestionScores:
    """Per-question exact and F1 (max over gold answers), in example order."""

    qids: list[str]
    exact: list[float]
    f1: list[float]
    has_answer: list[bool]


def question_scores(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                    version_2: bool) -> QuestionScores:
    """Score every example; a question without a prediction scores 0 (as v1.1's scorer)."""
    exact, f1, has_answer = [], [], []
    for e in examples:
        golds = [a.text for a in e.answers]
        if version_2:
            golds = [g for g in golds if normalize_answer(g)] or [""]
        pred = predictions.get(e.qid)
        if pred is None:
            exact.append(0.0)
            f1.append(0.0)
        else:
            exact.append(max(exact_match(pred, g) for g in golds))
            f1.append(max(token_f1(pred, g, version_2) for g in golds))
        has_answer.append(bool(e.answers))
    return QuestionScores([e.qid for e in examples], exact, f1, has_answer)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def squad_v1_metrics(examples: Sequence[SquadExample], predictions: Mapping[str, str]
                     ) -> dict[str, float]:
    """{"exact", "f1"} over every example (evaluate-v1.1.py)."""
    scores = question_scores(examples, predictions, version_2=False)
    return {"exact": _mean(scores.exact), "f1": _mean(scores.f1)}


def best_threshold(scores: Sequence[float], null_odds: Sequence[float],
                   has_answer: Sequence[bool], answered: Sequence[bool]) -> tuple[float, float]:
    """(best metric, threshold): predict "" where null_odds > threshold.

    `scores`: the metric of each question's span prediction; `answered`: whether that
    prediction is non-empty. Questions are walked in rising null odds, starting from every
    one predicted "" (the evaluate-v2.0.py `find_best_thresh` walk, first best kept,
    threshold 0.0 when answering none is best)."""
    total = len(scores)
    current = best = float(sum(not h for h in has_answer))
    threshold = 0.0
    for i in sorted(range(total), key=lambda k: null_odds[k]):
        if has_answer[i]:
            current += scores[i]
        else:
            current += -1.0 if answered[i] else 0.0
        if current > best:
            best, threshold = current, null_odds[i]
    return best / total if total else 0.0, threshold


def squad_v2_metrics(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                     null_odds: Mapping[str, float] | None = None) -> dict[str, float]:
    """exact, f1, HasAns_/NoAns_ exact and f1 and totals (evaluate-v2.0.py), and with
    `null_odds` the best exact/f1 over thresholds and those thresholds (on these predictions).
    """
    scores = question_scores(examples, predictions, version_2=True)
    out = {"exact": _mean(scores.exact), "f1": _mean(scores.f1), "total": len(examples)}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        keep = [i for i, h in enumerate(scores.has_answer) if h == wanted]
        if keep:
            out[f"{name}_exact"] = _mean([scores.exact[i] for i in keep])
            out[f"{name}_f1"] = _mean([scores.f1[i] for i in keep])
            out[f"{name}_total"] = len(keep)
    if null_odds is not None:
        odds = [null_odds[q] for q in scores.qids]
        answered = [bool(predictions.get(q)) for q in scores.qids]
        for metric in ("exact", "f1"):
            best, threshold = best_threshold(getattr(scores, metric), odds, scores.has_answer,
                                             answered)
            out[f"best_{metric}"], out[f"best_{metric}_thresh"] = best, threshold
    return out
