"""SQuAD reader and windows: exact counts on the real files, bad input named, and windows equal
to BERT's own `convert_examples_to_features` (peers/bert_squad.py) on real dev questions."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from finetune.checkpoint import load_tokenizer
from finetune.squad import data as squad_data
from finetune.squad.features import (
    WindowConfig,
    answer_tokens,
    collate_windows,
    cut_windows,
    doc_spans,
    max_context_windows,
)
from peers import bert_squad
from tests.conftest import skip_or_fail
from tests.support.squad_fixtures import squad_slice


@pytest.mark.parametrize("name, training, version_2, articles, paragraphs, questions, nulls", [
    ("dev-v1.1.json", False, False, 48, 2067, 10570, 0),
    ("train-v2.0-first11.json", True, True, 11, 773, 5147, 348),
    ("dev-v2.0-cs224n.json", False, True, 16, 646, 6078, 3168),
    ("dev-v2.0-normans-rhine.json", False, True, 2, 83, 706, 320),
])
def test_counts_of_the_shared_files(shared_data, name, training, version_2, articles,
                                    paragraphs, questions, nulls):
    split = squad_data.read_squad(str(shared_data / "squad" / name), training, version_2)
    assert len({e.article for e in split.examples}) == articles
    assert len({(e.article, e.context) for e in split.examples}) == paragraphs
    assert (len(split), split.num_unanswerable, len(split.bad_records)) == (questions, nulls, 0)


def test_malformed_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "train-v1.1.json"
    path.write_text('{"version": "1.1",\n "data": [{"title": "x",]}', encoding="utf-8")
    with pytest.raises(squad_data.SquadFormatError, match=rf"{path}:2:25: not JSON"):
        squad_data.read_squad(str(path), training=True, version_2=False)
    path.write_bytes(b'{"data": "\xff"}')
    with pytest.raises(squad_data.SquadFormatError,
                       match=rf"{path}:1: not UTF-8 text \(invalid start byte, byte 0xff\)"):
        squad_data.read_squad(str(path), training=True, version_2=False)


def _edit(shared_data, tmp_path, name, edit):
    """A one-article slice of a shared file with `edit(dataset)` applied."""
    path = squad_slice(shared_data / "squad" / name, tmp_path / name, {0: [0, 1]})
    dataset = json.loads(path.read_text(encoding="utf-8"))
    edit(dataset)
    path.write_text(json.dumps(dataset), encoding="utf-8")
    return str(path)


def test_a_bad_question_is_named_by_its_id(shared_data, tmp_path):
    def drop_question(dataset):
        del dataset["data"][0]["paragraphs"][1]["qas"][2]["question"]

    path = _edit(shared_data, tmp_path, "dev-v1.1.json", drop_question)
    with pytest.raises(squad_data.SquadFormatError,
                       match=r"dev-v1.1.json: question 56be4e1facb8001400a502fa: missing 'question'"):
        squad_data.read_squad(path, training=False, version_2=False)

    def no_context(dataset):
        del dataset["data"][0]["paragraphs"][1]["context"]

    path = _edit(shared_data, tmp_path, "dev-v1.1.json", no_context)
    with pytest.raises(squad_data.SquadFormatError,
                       match=r"data\[0\]\.paragraphs\[1\]: missing 'context'"):
        squad_data.read_squad(path, training=False, version_2=False)


def test_answers_not_at_answer_start_are_set_aside(shared_data, tmp_path):
    def move_answers(dataset):
        qas = dataset["data"][0]["paragraphs"][0]["qas"]
        qas[0]["answers"][0]["answer_start"] += 3  # its other two answers are where they say
        for answer in qas[1]["answers"]:
            answer["answer_start"] = 0  # none left: the question is set aside

    path = _edit(shared_data, tmp_path, "dev-v1.1.json", move_answers)
    train = squad_data.read_squad(path, training=True, version_2=False)
    assert len(train) == 30 + 25 - 1
    assert [b.record for b in train.bad_records] == [
        "question 56be4db0acb8001400a502ec answer 0", "question 56be4db0acb8001400a502ed answer 0",
        "question 56be4db0acb8001400a502ed answer 1", "question 56be4db0acb8001400a502ed answer 2"]
    assert "is not at answer_start 180" in train.bad_records[0].reason
    assert train.examples[0].answers == (squad_data.Answer("Denver Broncos", 177),)
    dev = squad_data.read_squad(path, training=False, version_2=False)  # scored on text only
    assert (len(dev), len(dev.bad_records)) == (55, 0)


def test_unanswerable_question_in_a_v1_training_file_is_refused(shared_data):
    path = str(shared_data / "squad" / "train-v2.0-first11.json")
    with pytest.raises(squad_data.SquadFormatError,
                       match=r"question 5a8d7bf7df8bba001a0f9ab1 is unanswerable.*v2\.0"):
        squad_data.read_squad(path, training=True, version_2=False)


def test_missing_files_are_named(tmp_path):
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "dev-v1.1.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"squad/train-v1\.1\.json"):
        squad_data.check_files(str(tmp_path), "squad1")
    with pytest.raises(FileNotFoundError, match=r"train-v2\.0\.json, .*dev-v2\.0\.json"):
        squad_data.check_files(str(tmp_path), "squad2")


def test_doc_spans_and_max_context_follow_the_reference_rules():
    assert doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert doc_spans(5, 8, 2) == [(0, 5)]
    assert doc_spans(0, 8, 2) == []
    # run_squad.py's example: "the man went to the store and bought a gallon of milk", spans of
    # 5 words: "bought" (position 7) has its most context in span C (start 6), not B (start 3).
    spans = [(0, 5), (3, 5), (6, 5)]
    assert max_context_windows(spans, 11)[7] == 2
    assert max_context_windows(spans, 11).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    offsets = np.array([[0, 4], [5, 6], [6, 10], [10, 11]])  # "cafe (1895-"
    assert answer_tokens(offsets, 6, 10) == (2, 2)
    assert answer_tokens(offsets, 7, 9) == (2, 2)  # inside a token: that token
    assert answer_tokens(offsets, 4, 5) is None  # only the space


@pytest.fixture(scope="module")
def peer():
    reason = bert_squad.available()
    if reason:
        skip_or_fail(reason)
    return bert_squad.load()


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return load_tokenizer(str(minilm_dir))


def compare_windows(peer, path, minilm_dir, tokenizer, cfg: WindowConfig, version_2=False):
    """Counts of agreement between the peer's features and our windows (training mode)."""
    peer_examples = bert_squad.read_examples(peer, path, True, version_2)
    features = bert_squad.convert(peer, peer_examples, str(minilm_dir / "vocab.txt"), True,
                                  cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length, True)
    split = squad_data.read_squad(path, training=True, version_2=version_2)
    windows, uncovered = cut_windows(split.examples, tokenizer, cfg, training=True)
    assert uncovered == [] and len(features) == len(windows)
    counts, moved = Counter(), []
    for n, feature in enumerate(features):
        assert feature.example_index == windows.example_index[n]
        counts["ids"] += feature.input_ids[:len(feature.tokens)] == windows.input_ids[n].tolist()
        start = windows.passage_start[n]
        counts["max_context"] += [feature.token_is_max_context[start + i] for i in range(
            len(windows.max_context[n]))] == windows.max_context[n].tolist()
        ours = (windows.start_positions[n], windows.end_positions[n])
        if (feature.start_position, feature.end_position) == ours:
            counts["positions"] += 1
        else:
            moved.append((split.examples[windows.example_index[n]], feature, windows, n))
    return len(features), counts, moved


def test_windows_equal_the_reference_on_real_dev_questions(peer, shared_data, tmp_path,
                                                           minilm_dir, tokenizer):
    # European Union law: its longest passages (30 questions in 105 windows); Super Bowl 50
    # paragraphs where the answer's characters sit inside a longer whitespace word.
    path = str(squad_slice(shared_data / "squad" / "dev-v1.1.json", tmp_path / "dev.json",
                           {15: [8, 12, 31, 32, 39], 0: [0, 1, 9, 32]}))
    total, counts, moved = compare_windows(peer, path, minilm_dir, tokenizer, WindowConfig())
    assert (total, counts["ids"], counts["max_context"], counts["positions"]) == (197, 197, 197, 191)
    # Where they differ, the offsets give the token that holds the annotated characters; the
    # reference, whitespace words first, keeps the whole word ("20–18" for the answer "8").
    shown = {}
    for example, feature, windows, n in moved:
        answer = example.answers[0]
        first = windows.passage_start[n]
        ours = windows.offsets[n][windows.start_positions[n] - first:
                                  windows.end_positions[n] - first + 1]
        assert ours[0, 0] <= answer.start and answer.end <= ours[-1, 1]
        theirs = " ".join(feature.tokens[feature.start_position:feature.end_position + 1])
        shown[answer.text] = (example.context[ours[0, 0]:ours[-1, 1]], theirs)
    assert shown == {"gold": ("golden", '" golden'), "8": ("18", "20 – 18"),
                     "4": ("49", "49 – 15"), "2": ("12", "12 – 4"), "7": ("1978", "1978 ."),
                     "36": ("360", "360 — an")}


def test_short_windows_equal_the_reference(peer, shared_data, tmp_path, minilm_dir, tokenizer):
    # Many windows per passage (stride 32 of 85 passage tokens): the max-context choice matters.
    path = str(squad_slice(shared_data / "squad" / "train-v2.0-first11.json",
                           tmp_path / "train.json", {0: list(range(6))}))
    cfg = WindowConfig(max_seq_length=128, doc_stride=32, max_query_length=24)
    total, counts, moved = compare_windows(peer, path, minilm_dir, tokenizer, cfg, True)
    assert (total, counts["ids"], counts["max_context"], len(moved)) == (312, 312, 312, 0)


def test_windows_batch_pads_to_the_longest(shared_data, tmp_path, tokenizer):
    path = str(squad_slice(shared_data / "squad" / "dev-v1.1.json", tmp_path / "d.json",
                           {2: [0]}))
    split = squad_data.read_squad(path, training=True, version_2=False)
    windows, _ = cut_windows(split.examples, tokenizer, WindowConfig(), training=True)
    batch = collate_windows(windows, [0, 3], 384)
    lengths = windows.lengths[[0, 3]].tolist()
    assert batch.input_ids.shape == (2, max(lengths)) and batch.seq_length == 384
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert batch.token_type_ids[0, :windows.passage_start[0]].sum() == 0
    assert batch.token_type_ids[0].sum() == lengths[0] - windows.passage_start[0]
    first = windows.passage_start[0]
    start, end = windows.start_positions[0], windows.end_positions[0]
    text = split.examples[0].context[windows.offsets[0][start - first, 0]:
                                     windows.offsets[0][end - first, 1]]
    assert text == split.examples[0].answers[0].text
