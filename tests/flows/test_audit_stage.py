"""The flow's corpus stages for an honest evaluation: near-duplicates removed, the contamination
audit of the evaluation sets the flow scores (tasks without files left out), and the corpus
decontaminated before the vocabulary (flows/steps.py, without Prefect)."""
from __future__ import annotations

import json
from pathlib import Path

from flows import report as reporting
from flows import steps
from flows.config import resolve

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"


def test_audit_and_decontamination_stages(tmp_path):
    squad = json.loads((SAMPLE / "squad" / "dev-v1.1.json").read_text())
    context = squad["data"][0]["paragraphs"][0]["context"]
    books = (SAMPLE / "books" / "austen-emma.txt").read_text(encoding="utf-8", errors="replace")
    paragraph = next(" ".join(p.split()) for p in books.split("\n\n") if len(p.split()) > 120)
    records = [{"id": "planted", "text": f"{paragraph}\n\n{context}"},
               {"id": "original", "text": paragraph},
               {"id": "copy", "text": paragraph.replace(" the ", " a ", 1)}]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "data": {
        "wikipedia": "", "books": "", "decontaminate": True,
        "near_duplicates": {"threshold": 0.8},
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "in"),
                     "id_field": "id", "split": "file"}]},
        "finetune": {"tasks": ["squad1", "rte", "wnli"]}}, data_only=True)
    assert steps.audited_tasks(cfg) == ("squad1", "rte")  # the sample has no WNLI
    own = [steps.extract_documents(cfg, s) for s in cfg.data.all_sources()]
    corpus = steps.build_corpus(cfg, own)
    assert corpus.manifest["counts"]["near_duplicates_removed"] == 1
    audit = steps.audit_contamination(cfg, corpus)
    report = json.loads((Path(audit.path) / "report.json").read_text())
    assert report["corpus"]["passages_contaminated"] == 1
    result = reporting.report(cfg, [*own, corpus, audit], None, "report-data.md")
    text = (tmp_path / "run" / "report-data.md").read_text()
    assert "## Contamination audit (13-grams)" in text
    squad_dev = report["tasks"]["squad1"]["splits"]["dev"]
    assert squad_dev["examples_overlapping"] == 5  # every question of the planted context
    assert (f"| squad1 | dev | {squad_dev['examples']} | 5 | "
            f"{5 / squad_dev['examples']:.2%} |") in text
    assert "| rte | dev | 100 | 0 | 0.00% | 0.00% |" in text
    assert result["audit"]["corpus"]["passages_contaminated"] == 1
    clean = steps.decontaminate(cfg, corpus, audit)
    assert clean.stage == "corpus-clean"
    again = steps.audit_contamination(cfg, clean)
    assert json.loads((Path(again.path) / "report.json").read_text())[
        "corpus"]["passages_contaminated"] == 0
