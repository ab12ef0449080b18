"""SQuAD post-processing: the span rules on hand-made logits, and the same answers as BERT's own
`write_predictions` (peers/bert_squad.py) on the same logits over real dev questions, except
where the offsets give the passage's own characters (counted and shown)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from finetune.checkpoint import load_tokenizer
from finetune.squad import data as squad_data
from finetune.squad import postprocess
from finetune.squad.features import WindowConfig, Windows, cut_windows
from finetune.squad.postprocess import PostprocessConfig, window_best_span
from peers import bert_squad
from tests.conftest import skip_or_fail
from tests.support.squad_fixtures import noisy_logits, squad_slice


def test_best_span_skips_invalid_pairs():
    # window: [CLS] q q [SEP] p0..p5 [SEP]; passage from position 4 to 9
    start = np.array([0, 9, 0, 0, 1, 2, 3, 4, 5, 0, 0], np.float64)
    end = np.array([0, 0, 8, 0, 0, 1, 2, 3, 4, 6, 0], np.float64)
    every = np.ones(6, bool)
    cfg = PostprocessConfig(n_best_size=20, max_answer_length=30)
    # start 1 is in the question, end 2 too: the best valid pair is start 8, end 9
    assert window_best_span(start, end, 4, every, cfg) == (5 + 6, 8, 9)
    # start 8 without its max context: start 7 (score 4 + 6)
    assert window_best_span(start, end, 4, np.array([1, 1, 1, 1, 0, 1], bool), cfg) == (10, 7, 9)
    # at most 1 token: j == i
    assert window_best_span(start, end, 4, every, PostprocessConfig(20, 1)) == (9, 8, 8)
    # only the 2 best starts (1, 8) and ends (2, 9) are paired: (8, 9)
    assert window_best_span(start, end, 4, every, PostprocessConfig(2, 30)) == (11, 8, 9)
    # the best start and end are both in the question: no valid pair
    assert window_best_span(start, end, 4, every, PostprocessConfig(1, 30)) is None


def test_answer_text_comes_from_the_passage_through_offsets(minilm_dir):
    context = "The  Broncos beat the Panthers 24\u201310 in\nSanta Clara."
    example = squad_data.SquadExample("q", "Who won?", context, ())
    tokenizer = load_tokenizer(str(minilm_dir))
    windows, _ = cut_windows([example], tokenizer, WindowConfig(), training=False)
    tokens = [tokenizer.id_to_token(int(i)) for i in windows.input_ids[0]]
    start, end = [np.full(len(tokens), -5.0, np.float32) for _ in range(2)]
    start[tokens.index("24")], end[tokens.index("10")] = 3, 2  # "24–10": three tokens
    start[tokens.index("santa")], end[tokens.index("clara")] = 2.5, 2.0
    spans = postprocess.predict_spans([example], windows, [start], [end])
    assert (spans[0].text, spans[0].start_char, spans[0].end_char) == ("24\u201310", 31, 36)
    assert spans[0].score == 5.0 and spans[0].null_score == -10.0
    end[tokens.index("10")] = -5
    spans = postprocess.predict_spans([example], windows, [start], [end])
    assert spans[0].text == "24\u201310 in\nSanta Clara"  # the passage's own whitespace
    assert postprocess.answers([example], spans, null_threshold=-16.0) == {"q": ""}
    assert postprocess.answers([example], spans, null_threshold=-14.0) == {"q": spans[0].text}
    assert postprocess.null_odds([example], spans) == {"q": -15.0}


@pytest.fixture(scope="module")
def peer():
    reason = bert_squad.available()
    if reason:
        skip_or_fail(reason)
    return bert_squad.load()


def run_both(peer, path: str, minilm_dir, version_2: bool, seed: int):
    """(our spans, the peer's answers and null odds, our examples) on the same noisy logits."""
    tokenizer = load_tokenizer(str(minilm_dir))
    split = squad_data.read_squad(path, training=False, version_2=version_2)
    # training=True cuts the same windows and gives each its gold positions for the logits
    windows, _ = cut_windows(split.examples, tokenizer, WindowConfig(), training=True)
    peer_examples = bert_squad.read_examples(peer, path, False, version_2)
    features = bert_squad.convert(peer, peer_examples, str(minilm_dir / "vocab.txt"), True,
                                  384, 128, 64, False)
    assert [f.input_ids[:len(f.tokens)] for f in features] == [w.tolist()
                                                               for w in windows.input_ids]
    start, end = noisy_logits(windows, seed)
    spans = postprocess.predict_spans(split.examples, windows, start, end)
    answers, odds = bert_squad.predictions(peer, peer_examples, features, start, end, True,
                                           version_2)
    return split.examples, spans, answers, odds


def differences(examples, ours: dict, theirs: dict) -> tuple[int, list]:
    """(questions answered identically, [(ours, theirs)] for the others)."""
    same = sum(ours[e.qid] == theirs[e.qid] for e in examples)
    return same, [(ours[e.qid], theirs[e.qid]) for e in examples if ours[e.qid] != theirs[e.qid]]


def test_v1_answers_equal_the_reference(peer, shared_data, tmp_path, minilm_dir):
    # Oxygen: formulas written "O\n2" in the passages; Super Bowl 50: scores like "24–10".
    path = str(squad_slice(shared_data / "squad" / "dev-v1.1.json", tmp_path / "dev.json",
                           {12: list(range(8)), 0: list(range(6))}))
    examples, spans, theirs, _ = run_both(peer, path, minilm_dir, False, seed=1)
    ours = postprocess.answers(examples, spans)
    same, shown = differences(examples, ours, theirs)
    # The 3 others differ only where the passage breaks a line inside the answer ("O\n3"):
    # the reference joins its whitespace words with " ", the offsets keep the passage's "\n".
    assert (same, len(shown)) == (206, 3)
    assert [" ".join(a.split()) == b and "\n" in a for a, b in shown] == [True] * 3
    assert shown[0][0].endswith("ozone (O\n3), strongly absorbs UVB radiation and consequently "
                                "the high-altitude")


def test_v2_answers_and_null_odds_equal_the_reference(peer, shared_data, tmp_path,
                                                       minilm_dir):
    path = str(squad_slice(shared_data / "squad" / "dev-v2.0-normans-rhine.json",
                           tmp_path / "dev.json", {0: list(range(12))}))
    examples, spans, theirs, their_odds = run_both(peer, path, minilm_dir, True, seed=2)
    odds = postprocess.null_odds(examples, spans)
    assert odds.keys() == their_odds.keys()
    assert max(abs(odds[q] - their_odds[q]) for q in odds) < 1e-9
    ours = postprocess.answers(examples, spans, null_threshold=0.0)
    same, shown = differences(examples, ours, theirs)
    assert (sum(a == "" for a in ours.values()), same, shown) == (22, 70, [])


def test_a_question_without_valid_span_gets_the_empty_answer():
    windows = Windows([np.array([101, 7, 102, 8, 102])], np.array([0]), np.array([3]),
                      [np.array([[0, 1]])], [np.array([False])], np.array([0]), np.array([0]))
    example = squad_data.SquadExample("q", "?", "x", ())
    spans = postprocess.predict_spans([example], windows, [np.zeros(5)], [np.zeros(5)])
    assert spans[0].text == "" and spans[0].score == -np.inf and spans[0].null_score == 0.0


def test_null_odds_file_is_strict_json_when_a_question_has_no_valid_span(shared_data,
                                                                           minilm_dir, tmp_path):
    import json
    import subprocess
    import sys

    from finetune.squad.family import score_split

    scorer = shared_data.parent / "peers" / "squad" / "evaluate-v2.0.py"
    if not scorer.is_file():
        skip_or_fail(f"needs the official SQuAD scorer {scorer}")
    path = squad_slice(shared_data / "squad" / "dev-v2.0-normans-rhine.json",
                       tmp_path / "dev.json", {0: list(range(3))})
    examples = squad_data.read_squad(str(path), training=False, version_2=True).examples
    windows, _ = cut_windows(examples, load_tokenizer(str(minilm_dir)), WindowConfig(),
                             training=True)
    start, end = noisy_logits(windows, seed=3)
    # question 0 (one window): the 20 best starts all lie after the 20 best ends
    assert list(windows.example_index).count(0) == 1 and len(windows.input_ids[0]) > 40
    start[0] = np.arange(len(start[0]), dtype=np.float32)
    end[0] = -np.arange(len(end[0]), dtype=np.float32)
    scored = score_split(examples, windows, np.array(start, dtype=object),
                         np.array(end, dtype=object), version_2=True)

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    odds = json.loads(scored.files["null_odds.json"], parse_constant=refuse)
    qid = examples[0].qid
    assert odds[qid] == postprocess.NO_SPAN_ODDS
    assert max(v for q, v in odds.items() if q != qid) < 1e3
    assert json.loads(scored.files["predictions.json"])[qid] == ""
    (tmp_path / "pred.json").write_text(scored.files["predictions.json"], encoding="utf-8")
    (tmp_path / "odds.json").write_text(scored.files["null_odds.json"], encoding="utf-8")
    done = subprocess.run([sys.executable, str(scorer), str(path), str(tmp_path / "pred.json"),
                           "--na-prob-file", str(tmp_path / "odds.json")],
                          capture_output=True, text=True, check=True, timeout=120)
    official = json.loads(done.stdout)
    threshold = json.loads(scored.files["squad2_threshold.json"])
    assert official["best_f1"] == pytest.approx(100 * threshold["best_f1"], rel=1e-13)
    assert official["best_f1_thresh"] == threshold["null_score_diff_threshold"]


def test_when_answering_none_is_best_tau_nulls_every_question(shared_data, minilm_dir,
                                                              tmp_path):
    from finetune.squad.family import score_split

    path = squad_slice(shared_data / "squad" / "dev-v2.0-normans-rhine.json",
                       tmp_path / "dev.json", {0: list(range(3))})
    examples = squad_data.read_squad(str(path), training=False, version_2=True).examples
    windows, _ = cut_windows(examples, load_tokenizer(str(minilm_dir)), WindowConfig(),
                             training=False)
    # every window sure of its second passage token, a wrong answer everywhere: odds -30
    start = [np.zeros(len(ids), np.float32) for ids in windows.input_ids]
    for n, logits in enumerate(start):
        logits[0], logits[windows.passage_start[n] + 1] = -10.0, 5.0
    scored = score_split(examples, windows, start, start, version_2=True)
    no_answer = sum(e.is_impossible for e in examples)
    assert 0 < no_answer < len(examples)
    # the official scorer's walk reports threshold 0.0 here (it starts there); the answers
    # written are all "" so that the F1 is the best F1 the walk found
    assert json.loads(scored.files["squad2_threshold.json"])["best_f1"] == pytest.approx(
        no_answer / len(examples))
    assert scored.metrics["f1"] == pytest.approx(no_answer / len(examples))
    assert set(json.loads(scored.files["predictions.json"]).values()) == {""}
