"""Near-duplicate removal (pipelines/corpus/near_duplicates.py) on real text: MinHash, LSH
bands, one document kept per cluster; in build_corpus, one pipeline and waves alike."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from common import storage
from common.settings import SettingError
from pipelines import build_corpus, parquet_io
from pipelines.corpus import near_duplicates as near
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from pipelines.corpus.near_duplicates import NearDuplicateConfig

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
