"""Entity-level NER scores as the CoNLL scorer (`conlleval`) computes them, through `seqeval`.

A predicted entity counts as correct only when a gold entity has the same type, first word and
last word (Tjong Kim Sang & De Meulder 2003). Precision = correct / predicted entities, recall =
correct / gold entities, F1 their harmonic mean, micro-averaged over all types; tokens are
decoded as `conlleval` does (an `I-` tag after `O` or another type starts an entity, so IOB1 and
IOB2 both score). `seqeval`'s default mode is that decoding;
tests/finetune/ner/test_ner_metrics.py checks it against a `conlleval`-style count on real tags
and on the edge cases. Values are fractions.
"""
from __future__ import annotations

from collections.abc import Sequence

from finetune.ner.data import Sentence


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
                  ) -> dict[str, float]:
    """precision, recall, f1 (micro over types), token accuracy, and f1_<type> per gold type.

    `gold`, `predicted`: the tags of each sentence, one list per sentence, the same lengths.
    """
    from seqeval.metrics import accuracy_score
    from seqeval.metrics.sequence_labeling import get_entities, precision_recall_fscore_support

    if len(gold) != len(predicted) or any(len(g) != len(p) for g, p in zip(gold, predicted)):
        raise ValueError("gold and predicted tags differ in sentences or words")
    gold_lists = [list(s) for s in gold]
    pred_lists = [list(s) for s in predicted]
    precision, recall, f1, _ = precision_recall_fscore_support(
        gold_lists, pred_lists, average="micro", zero_division=0)
    metrics = {"precision": float(precision), "recall": float(recall), "f1": float(f1),
               "accuracy": float(accuracy_score(gold_lists, pred_lists))}
    types = sorted({kind for kind, _, _ in get_entities(gold_lists)} |
                   {kind for kind, _, _ in get_entities(pred_lists)})
    if types:
        _, _, per_type, _ = precision_recall_fscore_support(
            gold_lists, pred_lists, average=None, zero_division=0)
        metrics.update({f"f1_{kind}": float(v) for kind, v in zip(types, per_type)})
    return metrics


def conll_predictions(sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]) -> str:
    """`word gold predicted` per line, an empty line after each sentence: what `conlleval`
    reads (`conlleval < predictions.txt`)."""
    lines = []
    for sentence, tags in zip(sentences, predicted, strict=True):
        lines.extend(f"{w} {g} {p}" for w, g, p in zip(sentence.words, sentence.tags, tags,
                                                        strict=True))
        lines.append("")
    return "\n".join(lines) + "\n" if lines else ""
