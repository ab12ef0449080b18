"""Entity-level scores: ours (seqeval) against a `conlleval`-style count written here, on real
CoNLL-2003 and WNUT-17 tags and on the IOB1/IOB2 edge cases; the predictions file layout."""
from __future__ import annotations

import random

import pytest

from finetune.ner import data
from finetune.ner.metrics import conll_predictions, entity_scores
from finetune.ner.tasks import NER_TASKS


def _split_tag(tag: str) -> tuple[str, str]:
    prefix, _, kind = tag.partition("-")
    return (prefix, kind) if kind else (tag, "")


def _end_of_chunk(prev: str, tag: str, prev_type: str, kind: str) -> bool:
    return ((prev, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O")}
            or (prev not in ("O", ".") and prev_type != kind))


def _start_of_chunk(prev: str, tag: str, prev_type: str, kind: str) -> bool:
    return ((prev, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I")}
            or (tag not in ("O", ".") and prev_type != kind))


def conlleval_counts(gold: list[list[str]], pred: list[list[str]]) -> tuple[int, int, int]:
    """(correct, predicted, gold) entities as conlleval's main loop counts them, line by line:
    a sentence boundary reads as an `O` line; a chunk is correct when both sequences start it
    at the same word with the same type and end it at the same word."""
    correct = found_pred = found_gold = 0
    in_correct = False
    last_g, last_gt, last_p, last_pt = "O", "", "O", ""
    lines = [(g, p) for gs, ps in zip(gold, pred) for g, p in [*zip(gs, ps), ("O", "O")]]
    for g_tag, p_tag in lines:
        g, gt = _split_tag(g_tag)
        p, pt = _split_tag(p_tag)
        if in_correct:
            g_end = _end_of_chunk(last_g, g, last_gt, gt)
            p_end = _end_of_chunk(last_p, p, last_pt, pt)
            if g_end and p_end and last_gt == last_pt:
                in_correct = False
                correct += 1
            elif g_end != p_end or gt != pt:
                in_correct = False
        g_start = _start_of_chunk(last_g, g, last_gt, gt)
        p_start = _start_of_chunk(last_p, p, last_pt, pt)
        if g_start and p_start and gt == pt:
            in_correct = True
        found_gold += g_start
        found_pred += p_start
        last_g, last_gt, last_p, last_pt = g, gt, p, pt
    correct += in_correct
    return correct, found_pred, found_gold


def conlleval_f1(gold, pred) -> tuple[float, float, float]:
    correct, found_pred, found_gold = conlleval_counts(gold, pred)
    precision = correct / found_pred if found_pred else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def corrupt(sentences: list[list[str]], labels: tuple[str, ...], rate: float,
            seed: int) -> list[list[str]]:
    """Predictions a tagger could make: each tag replaced by a random label with probability
    `rate` (I- tags after O, type changes mid-entity and B-I swaps all occur)."""
    rng = random.Random(seed)
    return [[rng.choice(labels) if rng.random() < rate else t for t in s] for s in sentences]


def to_iob1(tags: list[str]) -> list[str]:
    """IOB2 -> IOB1: an entity starts with I- unless it directly follows one of its type."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("B-") and not (i and tags[i - 1] != "O" and
                                         tags[i - 1][2:] == tag[2:]):
            tag = "I-" + tag[2:]
        out.append(tag)
    return out


@pytest.mark.parametrize("task,file", [("conll2003", "valid.txt"),
                                       ("wnut17", "emerging.dev.conll")])
@pytest.mark.parametrize("rate", [0.02, 0.1, 0.3])
def test_f1_equals_conlleval_on_real_tags(shared_data, task, file, rate):
    spec = NER_TASKS[task]
    split = data.read_conll(str(shared_data / spec.folder / file), spec.format)
    gold = [list(s.tags) for s in split.sentences]
    labels = data.label_list(split)
    pred = corrupt(gold, labels, rate, seed=7)
    ours = entity_scores(gold, pred)
    precision, recall, f1 = conlleval_f1(gold, pred)
    assert ours["precision"] == pytest.approx(precision, abs=1e-12)
    assert ours["recall"] == pytest.approx(recall, abs=1e-12)
    assert ours["f1"] == pytest.approx(f1, abs=1e-12)
    assert ours["f1"] < 1.0
    # conlleval prints two decimals: the same digits
    assert f"{100 * ours['f1']:.2f}" == f"{100 * f1:.2f}"


def test_perfect_and_iob1_scoring(shared_data):
    spec = NER_TASKS["conll2003"]
    split = data.read_conll(str(shared_data / spec.folder / "valid.txt"), spec.format)
    gold = [list(s.tags) for s in split.sentences]
    assert entity_scores(gold, gold)["f1"] == 1.0
    iob1 = [to_iob1(s) for s in gold]
    assert sum(t.startswith("B-") for s in iob1 for t in s) < 100  # mostly I- starts now
    # IOB1 decodes to the very same entities: perfect against the IOB2 gold
    assert entity_scores(gold, iob1)["f1"] == 1.0
    assert conlleval_counts(gold, iob1) == (5942, 5942, 5942)


EDGE_CASES = [
    # (gold, predicted, (correct, predicted entities, gold entities))
    (["B-PER", "I-PER", "O"], ["I-PER", "I-PER", "O"], (1, 1, 1)),  # I- starts an entity
    (["B-PER", "I-PER", "O"], ["B-PER", "B-PER", "O"], (0, 2, 1)),  # split in two
    (["B-PER", "I-PER", "O"], ["B-PER", "I-LOC", "O"], (0, 2, 1)),  # type change mid-way
    (["I-LOC", "B-LOC", "O"], ["B-LOC", "B-LOC", "O"], (2, 2, 2)),  # IOB1 adjacent entities
    (["O", "I-ORG", "I-ORG"], ["O", "I-ORG", "I-MISC"], (0, 2, 1)),  # entity at sentence end
    (["B-MISC"], ["O"], (0, 0, 1)),
    (["O", "O"], ["B-creative-work", "I-creative-work"], (0, 1, 0)),  # types with a hyphen
]


@pytest.mark.parametrize("gold,pred,counts", EDGE_CASES)
def test_edge_cases(gold, pred, counts):
    assert conlleval_counts([gold], [pred]) == counts
    precision, recall, f1 = conlleval_f1([gold], [pred])
    ours = entity_scores([gold], [pred])
    assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx((precision, recall,
                                                                             f1))
    assert len(data.entity_spans(pred)) == counts[1]
    assert len(data.entity_spans(gold)) == counts[2]


def test_entity_spans_equal_seqeval_on_real_tags(shared_data):
    from seqeval.metrics.sequence_labeling import get_entities

    spec = NER_TASKS["wnut17"]
    split = data.read_conll(str(shared_data / spec.folder / spec.train), spec.format)
    pred = corrupt([list(s.tags) for s in split.sentences], data.label_list(split), 0.2, seed=3)
    for tags in pred:
        assert data.entity_spans(tags) == get_entities(tags)


def test_per_type_and_predictions_file():
    gold = [["B-PER", "I-PER", "O"], ["B-LOC"]]
    pred = [["B-PER", "I-PER", "O"], ["B-ORG"]]
    scores = entity_scores(gold, pred)
    assert scores["f1"] == 0.5 and scores["accuracy"] == 0.75
    assert (scores["f1_PER"], scores["f1_LOC"], scores["f1_ORG"]) == (1.0, 0.0, 0.0)
    sentences = [data.Sentence(("Ann", "Lee", "ran"), tuple(gold[0]), 0, 1),
                 data.Sentence(("Paris",), tuple(gold[1]), 0, 5)]
    assert conll_predictions(sentences, pred) == (
        "Ann B-PER B-PER\nLee I-PER I-PER\nran O O\n\nParis B-LOC B-ORG\n\n")
    with pytest.raises(ValueError, match="differ"):
        entity_scores(gold, [["O"], ["O"]])
