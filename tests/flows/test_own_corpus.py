"""A user's own corpus through the flow's data stages: a JSONL file, a Parquet file and a text
folder as `data.sources` (set as a settings list, with weights), to shards, with the mixture
ledger in the run report. (The flow body's stage calls, flows/steps.py, without Prefect; the
tiny preset's model stages are covered by tests/flows/test_deployment.py.)"""
from __future__ import annotations

import dataclasses

from flows import report as reporting
from flows import steps
from flows.config import resolve
from tests.pipelines.documents.test_extract_documents_job import three_sources


def test_three_kinds_of_own_text_go_to_shards_with_the_ledger_in_the_report(tmp_path):
    sources = [dataclasses.asdict(s) for s in three_sources(tmp_path / "in")]
    sources[0]["weight"] = 2  # web: each document twice
    sources[2]["licence"] = "CC BY 4.0"
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "data": {
        "wikipedia": "", "books": "", "sources": sources}}, data_only=True)
    assert [s.name for s in cfg.data.all_sources()] == ["web", "tables", "notes"]
    own = [steps.extract_documents(cfg, s) for s in cfg.data.all_sources()]
    assert [s.stage for s in own] == ["documents-web", "documents-tables", "documents-notes"]
    corpus = steps.build_corpus(cfg, own)
    vocab = steps.train_vocab(cfg, corpus)
    shards = steps.make_shards(cfg, corpus, vocab, 1)
    assert shards.manifest["totals"]["num_instances"] > 0
    result = reporting.report(cfg, [*own, corpus, vocab, shards], None, "report-data.md")
    ledger = result["ledger"]
    assert {name: (row["documents_in"], row["repeats_added"], row["documents_out"],
                   row["licence"]) for name, row in ledger.items()} == {
        "notes": (1, 0, 1, "CC BY 4.0"), "tables": (2, 0, 2, ""), "web": (3, 3, 6, "")}
    assert (ledger["web"]["share_documents"], ledger["notes"]["records_read"]) == (0.6667, 1)
    text = (tmp_path / "run" / "report-data.md").read_text()
    assert "## Mixture (per source)" in text
    assert "| web | 2.0 | - | 3 |" in text and "| notes | 1.0 | CC BY 4.0 | 1 |" in text


def test_the_mixture_table_has_a_column_per_drop_and_every_row_adds_up(tmp_path):
    """A real corpus run with every kind of drop: exact and near-duplicates, a doc_id
    conflict, a quality filter, a document without sentences, sampling and repeats. On every
    row of the report's mixture table, in + repeats = out + the drop columns."""
    import json

    from common import storage
    from pipelines import build_corpus, parquet_io
    from pipelines.corpus.documents import DOCUMENT_SCHEMA
    from tests.pipelines.corpus.test_near_duplicates import _documents, paragraphs

    folder, texts = _documents(tmp_path)
    rows = [{"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": "f.txt",
             "title": "", "passages": [text]} for doc_id, text in texts.items()]
    news = paragraphs("chesterton-ball.txt", 6, min_words=100)
    rows += [{"doc_id": f"news/{i}", "source": "news", "source_file": "n.txt", "title": "",
              "passages": [text]} for i, text in enumerate(news)]
    rows += [{"doc_id": "web/exact", "source": "web", "source_file": "w.txt", "title": "",
              "passages": [texts["books/emma-5"]]},
             {"doc_id": "web/short", "source": "web", "source_file": "w.txt", "title": "",
              "passages": ["Too short to keep."]},
             {"doc_id": "books/blank", "source": "books", "source_file": "b.txt", "title": "",
              "passages": ["   "]},
             {"doc_id": "books/moby-0", "source": "books", "source_file": "z.txt", "title": "",
              "passages": ["Not the whale at all. Another text."]}]
    parquet_io.write_shard(str(folder), "documents", 0, 1, rows, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0"})
    sources = json.dumps([{"name": "web", "kind": "text", "path": "x", "weight": 2,
                           "quality": {"min_words": 5}},
                          {"name": "news", "kind": "text", "path": "y", "weight": 0.5}])
    manifest = build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "corpus"),
                                  "--sources", sources, "--set",
                                  "near_duplicates.threshold=0.8", "--wave_mb", "0"])
    table = reporting.ledger_table(manifest["ledger"])
    heads = [h.strip() for h in table[0].strip("|").split("|")]
    drops = ["duplicates", "id conflicts", "near duplicates", "quality: too_few_words",
             "no sentence", "sampled out"]
    assert heads[heads.index("documents in"):heads.index("documents out") + 1] == [
        "documents in", *drops, "repeats", "documents out"]
    found = {}
    for line in table[2:]:
        cells = dict(zip(heads, (c.strip() for c in line.strip("|").split("|"))))
        n = {h: int(cells[h]) for h in ["documents in", *drops, "repeats", "documents out"]}
        assert n["documents in"] + n["repeats"] == n["documents out"] + sum(n[d] for d in drops)
        found[cells["source"]] = [n[h] for h in ["documents in", *drops, "repeats",
                                                 "documents out"]]
    assert found == {"books": [14, 0, 1, 0, 0, 1, 0, 0, 12],
                     "news": [6, 0, 0, 0, 0, 0, 3, 0, 3],
                     "web": [6, 1, 0, 3, 1, 0, 0, 1, 2]}
