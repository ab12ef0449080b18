"""Near-duplicate removal (pipelines/corpus/near_duplicates.py, its Beam wiring
pipelines/corpus/remove_near_duplicates.py) on real text: shingles, MinHash, LSH bands, one
document kept per cluster; the transforms on Beam's local runner; in build_corpus, one pipeline
and waves alike."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to

from common import storage
from common.settings import SettingError
from pipelines import build_corpus, parquet_io
from pipelines.corpus import near_duplicates as near
from pipelines.corpus import remove_near_duplicates
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from pipelines.corpus.near_duplicates import NearDuplicateConfig
from pipelines.corpus.remove_near_duplicates import NearDuplicatePairs, RemoveNearDuplicates

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample"
CONFIG = NearDuplicateConfig()


def paragraphs(book: str, count: int, min_words: int = 80) -> list[str]:
    text = (SAMPLE / "books" / book).read_text(encoding="utf-8", errors="replace")
    found = [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) >= min_words]
    return found[:count]


def edited(text: str, share: float, seed: int) -> str:
    """`text` with `share` of its words replaced by another word."""
    rng = random.Random(seed)
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(share * len(words)))):
        words[i] = "zzxq" + str(rng.randrange(10 ** 6))
    return " ".join(words)


def true_jaccard(a: str, b: str, n: int = 5) -> float:
    sa = set(near.shingle_hashes(near.words([a]), n).tolist())
    sb = set(near.shingle_hashes(near.words([b]), n).tolist())
    return len(sa & sb) / len(sa | sb)


def test_signatures_estimate_jaccard_on_real_text():
    (original,) = paragraphs("austen-emma.txt", 1, min_words=200)
    copy = edited(original, 0.01, seed=1)
    sig_a, sig_b = near.signature([original], CONFIG), near.signature([copy], CONFIG)
    assert near.estimated_jaccard(sig_a, near.signature([original.upper()], CONFIG)) == 1.0
    assert abs(near.estimated_jaccard(sig_a, sig_b) - true_jaccard(original, copy)) < 0.1
    other = near.signature(paragraphs("melville-moby_dick.txt", 1)[0:1], CONFIG)
    assert near.estimated_jaccard(sig_a, other) < 0.1
    assert near.signature(["   "], CONFIG) is None
    assert np.array_equal(near.decode(near.encode(sig_a)), sig_a)


def test_the_banding_curve():
    assert CONFIG.rows == 8
    assert CONFIG.candidate_probability(0.9) > 0.999
    assert 0.94 < CONFIG.candidate_probability(0.8) < 0.96
    assert CONFIG.candidate_probability(0.5) < 0.07


def test_one_document_kept_per_cluster_and_chains():
    sig = near.signature(["one two three four five six seven eight nine ten"], CONFIG)
    other = near.signature(["alpha beta gamma delta epsilon zeta eta theta iota kappa"], CONFIG)
    members = [("b", sig), ("c", sig), ("a", sig), ("z", other)]
    assert near.cluster_removals(members, CONFIG) == [("b", "a"), ("c", "a")]
    assert near.cluster_removals(list(reversed(members)), CONFIG) == [("b", "a"), ("c", "a")]
    assert near.resolve([("c", "b"), ("c", "a"), ("b", "a")]) == {"c": "a", "b": "a"}


def test_config_errors_name_the_setting():
    with pytest.raises(SettingError, match="bands"):
        NearDuplicateConfig(num_perm=100, bands=16)
    with pytest.raises(SettingError, match="threshold"):
        NearDuplicateConfig(threshold=0)


def _documents(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """8 real Emma paragraphs, 4 Moby-Dick ones, and copies of 4 Emma ones with 1% or 20% of
    their words replaced."""
    emma = paragraphs("austen-emma.txt", 8, min_words=100)
    moby = paragraphs("melville-moby_dick.txt", 4, min_words=100)
    texts = {f"books/emma-{i}": p for i, p in enumerate(emma)}
    texts |= {f"books/moby-{i}": p for i, p in enumerate(moby)}
    texts |= {f"web/copy-{i}": edited(emma[i], 0.01, seed=i) for i in range(3)}
    texts["web/rewrite-3"] = edited(emma[3], 0.2, seed=3)
    rows = [{"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": "f.txt",
             "title": "", "passages": [text]} for doc_id, text in texts.items()]
    folder = tmp_path / "docs"
    parquet_io.write_shard(str(folder), "documents", 0, 1, rows, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0"})
    return folder, texts


def test_build_corpus_removes_near_duplicates_in_one_pipeline_and_in_waves(tmp_path):
    folder, texts = _documents(tmp_path)
    on = ["--set", "near_duplicates.threshold=0.8", "--num_shards", "3"]
    one = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "one"), *on,
                             "--wave_mb", "0"])
    lines = [json.loads(line) for line in
             (tmp_path / "one" / build_corpus.NEAR_DUPLICATES_FILE).read_text().splitlines()]
    assert [(d["removed"], d["duplicate_of"]) for d in lines] == [
        ("web/copy-0", "books/emma-0"), ("web/copy-1", "books/emma-1"),
        ("web/copy-2", "books/emma-2")]
    assert all(true_jaccard(texts[d["removed"]], texts[d["duplicate_of"]]) >= 0.8 for d in lines)
    assert true_jaccard(texts["web/rewrite-3"], texts["books/emma-3"]) < 0.5  # kept
    assert one["counts"]["near_duplicates_removed"] == 3 and one["counts"]["documents"] == 13
    assert one["ledger"]["web"]["near_duplicates_removed"] == 3
    assert one["config"]["near_duplicates"]["threshold"] == 0.8
    many = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "many"), *on,
                              "--wave_mb", "0.01"])
    assert many["waves"] > 1 and many["outputs"] == one["outputs"]
    assert many["counts"] == one["counts"]
    off = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "off")])
    assert off["counts"]["near_duplicates_removed"] == 0 and off["counts"]["documents"] == 16
    assert not (tmp_path / "off" / "near_duplicates").exists()


# ---------------------------------------------------------------- shingles and signatures

def test_shingles_are_hashed_word_ngrams_of_the_normalised_text():
    assert len(near.shingles("The  cat sat on the mat", 2)) == 5
    assert near.shingles("The  cat sat on the mat", 2) == near.shingles("the CAT sat\non the mat", 2)
    assert near.shingles("the cat", 2) < near.shingles("the cat sat", 2)
    assert len(near.shingles("too short", 5)) == 1  # fewer words than a shingle: one shingle
    assert near.shingles("too short", 5) == near.shingles("TOO  short", 5)
    assert near.shingles(" \n ", 5) == set()
    assert all(0 <= h < 2 ** 32 for h in near.shingles("one two three four five six", 5))


def test_a_signature_is_the_minhash_of_the_shingles():
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    sig = near.minhash(near.shingles(text, 5), CONFIG)
    assert sig.shape == (128,) and sig.dtype == np.uint32
    assert np.array_equal(near.signature([text], CONFIG), sig)
    assert near.minhash(set(), CONFIG) is None
    assert near.signature(["", " "], CONFIG) is None
    keys = near.band_keys(sig, CONFIG)
    assert len(keys) == 16 and [k.split(":")[0] for k in keys] == [str(b) for b in range(16)]


def test_signatures_and_band_keys_are_the_same_in_another_process():
    # Workers are separate processes with their own hash() salt: nothing may depend on it.
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    code = ("from pipelines.corpus import near_duplicates as n; c = n.NearDuplicateConfig(); "
            f"s = n.signature([{text!r}], c); print(n.encode(s), *n.band_keys(s, c))")
    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True).stdout.split()
    sig = near.signature([text], CONFIG)
    assert out == [near.encode(sig), *near.band_keys(sig, CONFIG)]


def test_a_chain_removes_each_member_naming_a_smaller_one():
    base = np.arange(128, dtype=np.uint32)
    b = base.copy()
    b[:20] += 1000  # a ~ b: 108/128 = 0.84
    c = b.copy()
    c[20:40] += 1000  # b ~ c: 0.84; a ~ c: 88/128 = 0.69, below 0.8
    assert near.estimated_jaccard(base, c) == 88 / 128
    members = [("c", c), ("a", base), ("b", b)]
    assert near.cluster_removals(members, CONFIG) == [("b", "a"), ("c", "b")]
    assert near.resolve([("c", "b"), ("b", "a")]) == {"b": "a", "c": "b"}


def test_config_errors_name_each_setting():
    for kwargs, message in [
            ({"shingle_size": 0}, "--shingle_size must be >= 1, got 0"),
            ({"num_perm": 0}, "--num_perm must be >= 1, got 0"),
            ({"num_perm": 100, "bands": 16}, "--bands must divide num_perm (100), got 16"),
            ({"threshold": 1.5}, "--threshold must be in (0, 1], got 1.5"),
            ({"seed": -1}, "--seed must be >= 0, got -1")]:
        with pytest.raises(SettingError) as error:
            NearDuplicateConfig(**kwargs)
        assert str(error.value) == message


# ---------------------------------------------------------------- the Beam transforms

def shared_paragraphs(shared_data: Path, book: str, count: int, min_words: int = 80) -> list[str]:
    text = (shared_data / "books" / book).read_text(encoding="utf-8", errors="replace")
    found = [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) >= min_words]
    return found[:count]


def span_edited(text: str, share: float, start: float, seed: int) -> str:
    """`text` with a run of `share` of its words (beginning at `start` of the text) replaced."""
    rng = random.Random(seed)
    words = text.split()
    k = max(1, round(share * len(words)))
    at = round(start * (len(words) - k))
    words[at:at + k] = [f"zzxq{rng.randrange(10 ** 6)}" for _ in range(k)]
    return " ".join(words)


def doc(doc_id: str, text: str) -> dict:
    return {"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": f"{doc_id}.txt",
            "title": "", "passages": [text]}


def counters(result, namespace: str) -> dict[str, int]:
    found = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    return {c.key.metric.name: c.committed for c in found if c.committed}


def assert_pairs(rows: list[dict], expected: list[tuple[str, str]]) -> None:
    """`NearDuplicatePairs` on `rows` gives exactly `expected` (in any order)."""
    with beam.Pipeline() as pipeline:
        pairs = pipeline | beam.Create(rows) | NearDuplicatePairs(CONFIG)
        assert_that(pairs, equal_to(expected))


def test_identical_texts_are_near_duplicates_and_empty_ones_never(shared_data):
    (text,) = shared_paragraphs(shared_data, "austen-persuasion.txt", 1)
    rows = [doc("web/b", text), doc("web/a", text.upper()), doc("web/c", "  ".join(text.split())),
            doc("web/e1", ""), doc("web/e2", " "), doc("web/s1", "short"), doc("web/s2", "Short")]
    assert_pairs(rows, [("web/b", "web/a"), ("web/c", "web/a"), ("web/s2", "web/s1")])


def test_unrelated_paragraphs_are_not_near_duplicates(shared_data):
    texts = [p for book in ("austen-emma.txt", "melville-moby_dick.txt", "chesterton-brown.txt")
             for p in shared_paragraphs(shared_data, book, 10)]
    assert len(texts) == 30
    assert_pairs([doc(f"books/{i:02d}", t) for i, t in enumerate(texts)], [])


def test_an_edited_copy_of_a_real_paragraph_is_removed_naming_the_original(shared_data):
    original, other = (shared_paragraphs(shared_data, "austen-emma.txt", 1, min_words=200)
                       + shared_paragraphs(shared_data, "melville-moby_dick.txt", 1))
    copy = span_edited(original, 0.03, 0.5, seed=1)  # 7 of 217 words, one run
    rewrite = edited(original, 0.1, seed=2)  # 10% of the words, scattered: far below 0.8
    assert true_jaccard(original, copy) > 0.9 and true_jaccard(original, rewrite) < 0.5
    rows = [doc("web/copy", copy), doc("books/emma", original), doc("books/moby", other),
            doc("web/rewrite", rewrite)]
    pipeline = beam.Pipeline()
    out = pipeline | beam.Create(rows) | RemoveNearDuplicates(CONFIG)
    assert_that(out["kept"], equal_to([rows[1], rows[2], rows[3]]), label="kept")
    assert_that(out["removed"], equal_to([json.dumps(
        {"removed": "web/copy", "duplicate_of": "books/emma", "source": "web",
         "source_file": "web/copy.txt"})]), label="removed")
    result = pipeline.run()
    result.wait_until_finish()
    assert counters(result, "build_corpus") == {"near_duplicates_removed": 1}
    assert counters(result, "build_corpus.sources") == {"web/near_duplicates_removed": 1}


def test_a_chain_of_real_edits_keeps_only_its_smallest_member(shared_data):
    (a,) = shared_paragraphs(shared_data, "austen-emma.txt", 1, min_words=200)
    b = span_edited(a, 0.055, 0.1, seed=3)
    c = span_edited(b, 0.055, 0.9, seed=4)
    sig = {name: near.signature([t], CONFIG) for name, t in (("a", a), ("b", b), ("c", c))}
    assert near.estimated_jaccard(sig["a"], sig["b"]) >= 0.8
    assert near.estimated_jaccard(sig["b"], sig["c"]) >= 0.8
    assert near.estimated_jaccard(sig["a"], sig["c"]) < 0.8
    rows = [doc("web/c", c), doc("web/a", a), doc("web/b", b)]
    assert_pairs(rows, [("web/b", "web/a"), ("web/c", "web/b")])


def test_the_result_is_the_same_whatever_the_input_order(shared_data):
    texts = shared_paragraphs(shared_data, "chesterton-ball.txt", 6, min_words=100)
    rows = [doc(f"books/{i}", t) for i, t in enumerate(texts)]
    rows += [doc(f"web/{i}-{j}", span_edited(texts[i], 0.02, j / 4, seed=j))
             for i in range(3) for j in range(3)]
    expected = [(f"web/{i}-{j}", f"books/{i}") for i in range(3) for j in range(3)]
    for seed in (0, 1):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        assert_pairs(shuffled, expected)


def test_the_transforms_use_build_corpus_counter_namespaces():
    assert remove_near_duplicates.NAMESPACE == build_corpus.NAMESPACE
    assert remove_near_duplicates.LEDGER_NAMESPACE == build_corpus.LEDGER_NAMESPACE
