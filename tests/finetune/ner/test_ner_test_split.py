"""CoNLL-2003's labelled test.txt is scored beside dev (the paper reports test F1), with the same
seqeval metric, and never picks the learning rate."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from finetune.family import Scored
from finetune.loop import merge_scored
from finetune.ner import FAMILY
from finetune.ner.tasks import NER_TASKS


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir))


def _gold_logits(encoded, num_labels: int) -> np.ndarray:
    gold = np.zeros((len(encoded), 128, num_labels), np.float32)
    for u, w in enumerate(encoded.word_labels):
        gold[u, np.arange(len(w)), w] = 1.0
    return gold


def test_conll2003_test_file_is_scored_as_test(shared_data, tokenizer):
    prepared = FAMILY.prepare("conll2003", str(shared_data / "conll2003"), tokenizer, 128, 40,
                              30, False)
    assert list(prepared.dev) == ["dev", "test"]
    assert dict(prepared.num_dev_examples) == {"dev": 30, "test": 30}
    labels = NER_TASKS["conll2003"].labels
    test = FAMILY.score(prepared, "test", {"logits": _gold_logits(prepared.dev["test"],
                                                                  len(labels))})
    assert test.metrics == {"test_f1": 1.0, "test_precision": 1.0, "test_recall": 1.0}
    assert test.selects is False and "predictions_test.txt" in test.files
    assert test.files["predictions_test.txt"].count("\n\n") == 30
    everything_o = np.zeros((len(prepared.dev["test"]), 128, len(labels)), np.float32)
    everything_o[..., 0] = 1.0
    miss = FAMILY.score(prepared, "test", {"logits": everything_o})
    assert (miss.metrics["test_f1"], miss.metrics["test_recall"]) == (0.0, 0.0)


def test_without_test_file_only_dev(shared_data, tokenizer, tmp_path):
    folder = tmp_path / "conll2003"
    folder.mkdir()
    for name in ("train.txt", "valid.txt"):
        shutil.copy(shared_data / "conll2003" / name, folder / name)
    prepared = FAMILY.prepare("conll2003", str(folder), tokenizer, 128, 10, 10, False)
    assert list(prepared.dev) == ["dev"] and dict(prepared.num_dev_examples) == {"dev": 10}


def test_test_split_is_reported_not_averaged_into_the_score():
    dev = Scored(metrics={"f1": 0.5}, score=0.5)
    test = Scored(metrics={"test_f1": 0.9}, score=0.9, selects=False)
    metrics, score, _ = merge_scored({"dev": dev, "test": test})
    assert (metrics, score) == ({"f1": 0.5, "test_f1": 0.9}, 0.5)
