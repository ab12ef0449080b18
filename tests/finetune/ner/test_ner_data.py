"""NER reading on the real CoNLL-2003 and WNUT-17 files: exact counts (SOURCES.md, the official
numbers), bad lines named by file and line, the label set, encoding to first sub-tokens.

CoNLL-2003 is licensed for research only: these tests read it from the shared data folder and
never copy it into the repository.
"""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

from finetune.ner import data
from finetune.ner.tasks import NER_TASKS

CONLL = NER_TASKS["conll2003"].format
WNUT = NER_TASKS["wnut17"].format

# (file, sentences, tokens, entities, documents, entities by type)
COUNTS = [
    ("conll2003/train.txt", CONLL, 14041, 203621, 23499, 946,
     {"PER": 6600, "LOC": 7140, "ORG": 6321, "MISC": 3438}),
    ("conll2003/valid.txt", CONLL, 3250, 51362, 5942, 216,
     {"PER": 1842, "LOC": 1837, "ORG": 1341, "MISC": 922}),
    ("conll2003/test.txt", CONLL, 3453, 46435, 5648, 231,
     {"PER": 1617, "LOC": 1668, "ORG": 1661, "MISC": 702}),
    ("wnut17/wnut17train.conll", WNUT, 3394, 62730, 1975, 0,
     {"person": 660, "location": 548, "group": 264, "corporation": 221, "product": 142,
      "creative-work": 140}),
    ("wnut17/emerging.dev.conll", WNUT, 1009, 15733, 836, 0,
     {"person": 470, "location": 74, "group": 39, "corporation": 34, "product": 114,
      "creative-work": 105}),
    ("wnut17/emerging.test.annotated", WNUT, 1287, 23394, 1079, 0,
     {"person": 429, "location": 150, "group": 165, "corporation": 66, "product": 127,
      "creative-work": 142}),
]


@pytest.mark.parametrize("name,fmt,sentences,tokens,entities,documents,by_type", COUNTS,
                         ids=[c[0] for c in COUNTS])
def test_exact_counts(shared_data, name, fmt, sentences, tokens, entities, documents, by_type):
    split = data.read_conll(str(shared_data / name), fmt)
    assert (len(split), split.num_tokens, split.num_entities, split.num_documents) == \
        (sentences, tokens, entities, documents)
    kinds = collections.Counter(k for s in split.sentences for k, _, _ in data.entity_spans(s.tags))
    assert kinds == by_type
    # both files are IOB2: every entity starts with B-, so B- tags count the entities
    assert sum(t.startswith("B-") for s in split.sentences for t in s.tags) == entities
    assert split.bad_records == []


def test_conll2003_sentences_and_documents(shared_data):
    train = data.read_conll(str(shared_data / "conll2003/train.txt"), CONLL)
    first = train.sentences[0]
    assert first.words == ("EU", "rejects", "German", "call", "to", "boycott", "British",
                           "lamb", ".")
    assert first.tags == ("B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O")
    assert (first.document, first.line) == (0, 3)
    assert train.sentences[1].words == ("Peter", "Blackburn")
    assert train.sentences[-1].document == 945
    assert len({s.document for s in train.sentences}) == 946
    assert max(len(s.words) for s in train.sentences) == 113
    assert data.label_list(train) == ("O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG",
                                      "I-ORG", "B-PER", "I-PER") == NER_TASKS["conll2003"].labels


def test_wnut17_whitespace_only_boundaries(shared_data):
    train = data.read_conll(str(shared_data / "wnut17/wnut17train.conll"), WNUT)
    # the file's first boundary is line 28, a line holding one tab
    first, second = train.sentences[:2]
    assert (first.line, len(first.words), first.words[-2:]) == (1, 27, ("evening", "."))
    assert (second.line, second.words[:3]) == (29, ("From", "Green", "Newsfeed"))
    # without a -DOCSTART- every sentence is its own document
    assert [s.document for s in train.sentences[:3]] == [0, 1, 2]
    assert data.label_list(train) == NER_TASKS["wnut17"].labels
    assert len(NER_TASKS["wnut17"].labels) == 13


def _write(tmp_path: Path, text: str, name: str = "bad.txt") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_malformed_lines_named_with_file_and_line(tmp_path):
    path = _write(tmp_path, "-DOCSTART- -X- -X- O\n\nA NN B-NP B-PER\nB NN I-NP\n\n")
    with pytest.raises(data.NerFormatError, match=r"bad\.txt:4: 3 ' '-separated fields"):
        data.read_conll(path, CONLL)
    path = _write(tmp_path, "A\tO\nB\tX-person\n")
    with pytest.raises(data.NerFormatError, match=r"bad\.txt:2: tag 'X-person' is not O"):
        data.read_conll(path, WNUT)
    (tmp_path / "latin.txt").write_bytes(b"A\tO\n\xe9\tO\n")
    with pytest.raises(data.NerFormatError, match=r"latin\.txt:2: not UTF-8"):
        data.read_conll(str(tmp_path / "latin.txt"), WNUT)


def test_skip_bad_records_sets_the_sentence_aside(tmp_path):
    text = "A\tB-person\nB\tI-person\n\nC\tO\nD\tO\tO\nE\tO\n\t\nF\tB-group\n"
    path = _write(tmp_path, text)
    split = data.read_conll(path, WNUT, skip_bad_records=True)
    assert [s.words for s in split.sentences] == [("A", "B"), ("F",)]
    assert [(s.line, s.document) for s in split.sentences] == [(1, 0), (8, 1)]
    assert len(split.bad_records) == 1
    bad = split.bad_records[0]
    assert (bad.file, bad.record) == (path, "line 5")
    assert "3 '\\t'-separated fields" in bad.reason


def test_unknown_dev_label_named(tmp_path):
    train = data.read_conll(_write(tmp_path, "A\tB-person\n\nB\tO\n", "train.txt"), WNUT)
    dev = data.read_conll(_write(tmp_path, "A\tO\nB\tB-person\n\nC\tI-group\n", "dev.txt"),
                          WNUT)
    labels = data.label_list(train)
    assert labels == ("O", "B-person")
    with pytest.raises(data.NerFormatError,
                       match=r"dev\.txt:4: tag 'I-group' is not a label of train\.txt"):
        data.check_labels(dev, labels, "train.txt")


def test_subset_fixed_seed_in_file_order(shared_data):
    dev = data.read_conll(str(shared_data / "wnut17/emerging.dev.conll"), WNUT)
    a, b = data.subset(dev, 100), data.subset(dev, 100)
    assert [s.line for s in a.sentences] == [s.line for s in b.sentences]
    assert [s.line for s in a.sentences] == sorted(s.line for s in a.sentences)
    assert len(a) == 100 and data.subset(dev, None) is dev
