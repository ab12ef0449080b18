"""The audit's pure functions: GPT-3's words, stable n-gram hashes, the index and its lookup."""
from __future__ import annotations

import hashlib
import subprocess
import sys

import apache_beam as beam
import numpy as np
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines import audit_contamination
from pipelines.contamination import index, ngrams
from pipelines.contamination.index import ExampleKey


def test_words_are_lower_case_without_punctuation_split_on_whitespace():
    assert ngrams.words("The U.S., said: don't  \tＦULL-width $5!") == [
        "the", "us", "said", "dont", "fullwidth", "5"]
    # A CoNLL sentence (tokens joined by spaces) reads as the running text it was cut from.
    assert ngrams.words("the U.S. , said") == ngrams.words("the U.S., said")


def test_ngram_hashes_are_stable_across_processes_and_equal_for_equal_ngrams():
    tokens = ["a", "b", "c", "a", "b", "c"]
    hashes = ngrams.ngram_hashes(tokens, 3)
    assert hashes.dtype == np.uint64 and len(hashes) == 4
    assert hashes[0] == hashes[3] and len(set(hashes.tolist())) == 3
    code = ("from pipelines.contamination import ngrams;"
            "print(ngrams.ngram_hashes('a b c a b c'.split(), 3).tolist())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == str(hashes.tolist())


def test_ngram_hash_is_the_polynomial_of_blake2b_word_hashes():
    def blake(word: str) -> int:
        return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")

    expected = ((blake("x") * 0x100000001B3 + blake("y")) % 2**64)
    assert ngrams.ngram_hashes(["x", "y"], 2).tolist() == [expected]


def test_a_text_shorter_than_n_words_has_no_ngram():
    assert len(ngrams.ngram_hashes(["a", "b"], 3)) == 0
    assert len(ngrams.text_ngrams(["a b", "c d"], 3)) == 0  # a gram never spans two fields
    assert len(ngrams.text_ngrams(["a b c", "c d"], 3)) == 1


EXAMPLES = [
    (ExampleKey("toy", "dev", "e1"), ("one two three four five six seven eight",)),
    (ExampleKey("toy", "dev", "e2"), ("nine ten", "eleven twelve")),
    (ExampleKey("toy", "test", "e3"), ("Four, five six SEVEN eight nine.",)),
]
PASSAGE = "zero x four five six seven eight y"
FIVE = ["four", "five", "six", "seven", "eight"]


def _found(n: int) -> list[tuple[str, str]]:
    built = index.build(EXAMPLES, n)
    records, _ = audit_contamination.passage_overlaps(built, "doc/1", 3, PASSAGE)
    return [(r["example_id"], r["ngram"]) for r in records]


def test_the_ngram_size_decides_what_overlaps():
    # The passage shares "four five six seven eight" (5 words) with e1 and, from e3, the same
    # 5 words; e2 shares nothing.
    assert _found(5) == [("e1", "four five six seven eight"), ("e3", "four five six seven eight")]
    assert _found(3) == [("e1", "four five six"), ("e3", "four five six")]
    assert _found(6) == []


def test_index_counts_and_task_ngrams():
    built = index.build(EXAMPLES, 3)
    assert built.ngram_counts.tolist() == [6, 0, 4]
    assert len(index.task_ngrams(built, "toy")) == 7  # e1 and e3 share 3 of their trigrams
    assert len(index.task_ngrams(built, "toy", "test")) == 4


def test_index_round_trips_through_its_file(tmp_path):
    built = index.build(EXAMPLES, 3)
    index.save(built, str(tmp_path / "i.npz"))
    loaded = index.load(str(tmp_path / "i.npz"))
    assert loaded.n == 3 and loaded.examples == built.examples
    assert loaded.hashes.tolist() == built.hashes.tolist()
    assert loaded.example_rows.tolist() == built.example_rows.tolist()


def test_audit_composite_streams_rows_past_the_index(tmp_path):
    path = str(tmp_path / "i.npz")
    index.save(index.build(EXAMPLES, 5), path)
    rows = [{"doc_id": "d1", "passages": ["unrelated words only here", PASSAGE]},
            {"doc_id": "d2", "passages": ["nothing at all"]}]
    with test_pipeline.TestPipeline() as p:
        found = p | beam.Create(rows) | audit_contamination.Audit(path)
        assert_that(found["passages"], equal_to(['{"doc_id": "d1", "passage": 1}']),
                    label="passages")
        assert_that(found["overlaps"] | beam.Map(lambda line: line.count('"d1"')),
                    equal_to([1, 1]), label="overlaps")
        assert_that(found["ngrams"], equal_to(
            [f"{int(ngrams.ngram_hashes(FIVE, 5)[0]):016x}"]),
            label="ngrams")
