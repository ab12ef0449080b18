"""From start/end logits per window to one answer per question (paper section 4.2 / 4.3).

The score of the span (i, j) is S.T_i + E.T_j with j >= i. As BERT's `write_predictions`:
only the `n_best_size` best starts and ends of each window are paired; a span must lie in the
passage, start on a token whose maximal context is this window, and be at most
`max_answer_length` tokens; the best span over all windows wins (the first on a tie, in window,
start-rank, end-rank order). The answer is the original passage's characters from the start
token's first to the end token's last (the tokenizer's offsets), never a detokenized string.

SQuAD v2.0: the null answer is the span at [CLS]; its score is the lowest start[0] + end[0]
over the question's windows. A span is predicted when best span score > null score + tau,
i.e. when `null_odds` = null score - best span score <= tau (the reference's
`null_score_diff_threshold`); tau is chosen on dev (`metrics.best_threshold`). A question
none of whose windows has a valid span has infinite odds; `null_odds.json` holds the largest
finite float for it instead (JSON has no infinity: strict parsers refuse Python's `Infinity`),
which still ranks above every real odds in the scorer's threshold search.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from finetune.squad.data import SquadExample
from finetune.squad.features import Windows, require_positive


@dataclass(frozen=True)
class PostprocessConfig:
    """How spans are chosen (BERT's defaults)."""

    n_best_size: int = 20
    """Best start and best end positions paired per window."""
    max_answer_length: int = 30
    """Longest answer, in tokens."""

    def __post_init__(self) -> None:
        require_positive(self, "n_best_size", "max_answer_length")


DEFAULT = PostprocessConfig()
NO_SPAN_ODDS = float(np.finfo(np.float64).max)
"""`null_odds.json`'s value for a question without any valid span (its odds are +inf)."""


@dataclass(frozen=True)
class SpanPrediction:
    """A question's best non-null span and its null score."""

    text: str
    """The best span's passage text; "" when no window has a valid span."""
    start_char: int
    """[start_char, end_char) in the passage; -1 when there is no span."""
    end_char: int
    score: float
    """start + end logit of the best span; -inf when there is none."""
    null_score: float
    """Lowest start[0] + end[0] over the question's windows (+inf without windows)."""

    @property
    def null_odds(self) -> float:
        """null score - best span score: the larger, the likelier "no answer"."""
        return self.null_score - self.score


def _top(logits: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n largest logits, ties in position order (a stable sort)."""
    return np.argsort(-logits, kind="stable")[:n]


def window_best_span(start_logits: np.ndarray, end_logits: np.ndarray, passage_start: int,
                     max_context: np.ndarray, cfg: PostprocessConfig
                     ) -> tuple[float, int, int] | None:
    """(score, start, end) of the best valid span of one window, or None.

    `start_logits`, `end_logits`: (T,) the window's real tokens only."""
    starts = _top(start_logits, cfg.n_best_size)  # (n,)
    ends = _top(end_logits, cfg.n_best_size)  # (n,)
    num_passage = len(max_context)
    s_in = (starts >= passage_start) & (starts < passage_start + num_passage)
    s_ok = s_in & max_context[np.clip(starts - passage_start, 0, max(num_passage - 1, 0))]
    e_ok = (ends >= passage_start) & (ends < passage_start + num_passage)
    length = ends[None, :] - starts[:, None] + 1  # (n, n)
    valid = s_ok[:, None] & e_ok[None, :] & (length >= 1) & (length <= cfg.max_answer_length)
    if not valid.any():
        return None
    scores = start_logits[starts][:, None] + end_logits[ends][None, :]  # (n, n)
    best = int(np.argmax(np.where(valid, scores, -np.inf)))  # row-major: the reference's order
    a, b = divmod(best, len(ends))
    return float(scores[a, b]), int(starts[a]), int(ends[b])


def predict_spans(examples: Sequence[SquadExample], windows: Windows,
                  start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray],
                  cfg: PostprocessConfig | None = None) -> list[SpanPrediction]:
    """One `SpanPrediction` per example from the logits of every window (window order).

    `start_logits[n]`, `end_logits[n]`: window n's logits, at least as long as the window
    (padding beyond it is ignored). Scores are summed in float64, as the reference's floats.
    """
    cfg = cfg or DEFAULT
    by_example: list[list[int]] = [[] for _ in examples]
    for n, e in enumerate(windows.example_index):
        by_example[e].append(n)
    out = []
    for example, window_ids in zip(examples, by_example):
        best, null_score = None, np.inf
        for n in window_ids:
            size = len(windows.input_ids[n])
            start = np.asarray(start_logits[n][:size], dtype=np.float64)
            end = np.asarray(end_logits[n][:size], dtype=np.float64)
            null_score = min(null_score, float(start[0] + end[0]))
            span = window_best_span(start, end, int(windows.passage_start[n]),
                                    windows.max_context[n], cfg)
            if span is not None and (best is None or span[0] > best[0]):
                best = (*span, n)
        if best is None:
            out.append(SpanPrediction("", -1, -1, -np.inf, null_score))
            continue
        score, i, j, n = best
        offsets, first = windows.offsets[n], int(windows.passage_start[n])
        start_char, end_char = int(offsets[i - first, 0]), int(offsets[j - first, 1])
        out.append(SpanPrediction(example.context[start_char:end_char], start_char, end_char,
                                  score, null_score))
    return out


def answers(examples: Sequence[SquadExample], spans: Sequence[SpanPrediction],
            null_threshold: float | None = None) -> dict[str, str]:
    """{qid: text}: the best span, or "" (v2.0) where null_odds > `null_threshold`.

    `null_threshold` None: always the span (SQuAD v1.1)."""
    return {e.qid: "" if null_threshold is not None and p.null_odds > null_threshold
            else p.text for e, p in zip(examples, spans)}


def null_odds(examples: Sequence[SquadExample], spans: Sequence[SpanPrediction]
              ) -> dict[str, float]:
    """{qid: null score - best span score}, the `null_odds.json` the official scorer reads;
    `NO_SPAN_ODDS` where no window has a valid span, so every value is finite JSON."""
    return {e.qid: float(p.null_odds) if np.isfinite(p.null_odds) else NO_SPAN_ODDS
            for e, p in zip(examples, spans)}
