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
