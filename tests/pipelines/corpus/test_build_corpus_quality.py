"""build_corpus with a source's quality filters: the documents dropped are counted per rule in
the ledger and listed; sources without filters pass untouched; in waves the same bytes."""
from __future__ import annotations

import json
from pathlib import Path

from common import storage
from pipelines import build_corpus, parquet_io
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from tests.pipelines.corpus.test_quality import CANDIDE, WERTHER

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample"


def _emma_paragraphs(count: int) -> list[str]:
    text = (SAMPLE / "books" / "austen-emma.txt").read_text(encoding="utf-8", errors="replace")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if len(p.split()) > 60]
    return paragraphs[:count]


def test_a_sources_filters_drop_and_list_documents(tmp_path):
    english = _emma_paragraphs(3)
    docs = [{"doc_id": f"news/{i}", "source": "news", "source_file": "news.jsonl",
             "title": "", "passages": [p]} for i, p in enumerate(english)]
    docs += [{"doc_id": "news/de", "source": "news", "source_file": "news.jsonl", "title": "",
              "passages": WERTHER * 8},
             {"doc_id": "news/short", "source": "news", "source_file": "news.jsonl",
              "title": "", "passages": ["Too short to keep."]},
             {"doc_id": "blog/fr", "source": "blog", "source_file": "blog.jsonl", "title": "",
              "passages": CANDIDE}]
    folder = tmp_path / "docs"
    parquet_io.write_shard(str(folder), "documents", 0, 1, docs, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0"})
    sources = json.dumps([{"name": "news", "kind": "jsonl", "path": "x",
                           "quality": {"languages": ["en"]}},
                          {"name": "blog", "kind": "jsonl", "path": "y"}])
    manifest = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "one"),
                                  "--sources", sources, "--num_shards", "3", "--wave_mb", "0"])
    assert manifest["counts"]["quality_dropped"] == 2
    assert manifest["counts"]["documents"] == 4  # 3 English news + the unfiltered blog
    news, blog = manifest["ledger"]["news"], manifest["ledger"]["blog"]
    assert (news["documents_in"], news["dropped_too_few_words"], news["dropped_language"],
            news["documents_out"]) == (5, 1, 1, 3)
    assert blog["documents_out"] == 1 and not any(k.startswith("dropped_") for k in blog)
    lines = [json.loads(line) for line in
             (tmp_path / "one" / build_corpus.QUALITY_FILE).read_text().splitlines()]
    assert [(d["doc_id"], d["filter"]) for d in lines] == [("news/de", "language"),
                                                           ("news/short", "too_few_words")]
    assert lines[0]["detail"].startswith("de (")
    assert build_corpus.QUALITY_FILE in [o["path"] for o in manifest["outputs"]]
    waves = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "waves"),
                               "--sources", sources, "--num_shards", "3", "--wave_mb",
                               "0.001"])
    assert waves["waves"] > 1 and waves["outputs"] == manifest["outputs"]
    assert waves["ledger"] == manifest["ledger"]


def test_no_filters_no_quality_file(tmp_path):
    folder = tmp_path / "docs"
    parquet_io.write_shard(str(folder), "documents", 0, 1, [
        {"doc_id": "books/a", "source": "books", "source_file": "a.txt", "title": "",
         "passages": ["Short. But kept."]}], DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0"})
    manifest = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "quality").exists()
    assert manifest["counts"]["quality_dropped"] == 0
