"""A corpus with planted evaluation text: the bundled Wikipedia sample (extract_wikipedia +
build_corpus, as the flow runs them) plus documents holding real SQuAD dev contexts and an RTE
dev sentence, and the audit of it against squad1 and rte."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from common import storage
from flows import audit_contamination as audit_cli
from pipelines import build_corpus, extract_wikipedia, parquet_io
from pipelines.corpus.documents import DOCUMENT_SCHEMA

REPO = Path(__file__).resolve().parents[3]
DUMP = REPO / "data" / "sample" / "wiki" / "enwiki-sample-pages-articles.xml.bz2"
PLANTED_PARAGRAPHS = ((3, 0), (12, 2), (25, 1), (40, 4))
"""(article, paragraph) of the SQuAD v1.1 dev contexts planted: four articles."""
RTE_GUID = "8"
"""The RTE dev example planted: its first sentence (Steve Jobs), in upper case."""


@dataclass(frozen=True)
class Planted:
    corpus: Path
    eval_data: Path
    audit: Path
    manifest: dict
    squad_qids: frozenset[str]
    """The questions of the planted contexts."""
    passages: frozenset[tuple[str, int]]
    """(doc_id, passage index) of every planted passage in the corpus."""


def _eval_data(shared: Path, root: Path) -> Path:
    """A fine-tuning data folder: squad/dev-v1.1.json and glue/RTE/{dev,test}.tsv (links)."""
    data = root / "eval"
    (data / "squad").mkdir(parents=True)
    (data / "squad" / "dev-v1.1.json").symlink_to(shared / "squad" / "dev-v1.1.json")
    (data / "glue" / "RTE").mkdir(parents=True)
    for name in ("dev.tsv", "test.tsv"):
        (data / "glue" / "RTE" / name).symlink_to(shared / "glue" / "RTE" / name)
    return data


def _rte_sentence(shared: Path) -> str:
    for line in (shared / "glue" / "RTE" / "dev.tsv").read_text().splitlines():
        fields = line.split("\t")
        if fields[0] == RTE_GUID:
            return fields[1]
    raise AssertionError(f"RTE dev has no example {RTE_GUID}")


def _planted_documents(shared: Path, folder: Path) -> tuple[frozenset[str], list[dict]]:
    squad = json.loads((shared / "squad" / "dev-v1.1.json").read_text())["data"]
    paragraphs = [squad[a]["paragraphs"][p] for a, p in PLANTED_PARAGRAPHS]
    qids = frozenset(qa["id"] for p in paragraphs for qa in p["qas"])
    filler = "A short passage about nothing in particular, written for this test."
    docs = [
        {"doc_id": "planted/a", "passages": [filler, paragraphs[0]["context"], filler + " Two.",
                                             paragraphs[1]["context"]]},
        {"doc_id": "planted/b", "passages": [paragraphs[2]["context"]]},
        {"doc_id": "planted/c", "passages": [paragraphs[3]["context"], filler + " Three."]},
        {"doc_id": "planted/d", "passages": [
            f"Quoted in a review: {_rte_sentence(shared).upper()} The review goes on.",
            filler + " Four."]},
    ]
    rows = [{**d, "source": "planted", "source_file": "planted.txt", "title": d["doc_id"]}
            for d in docs]
    parquet_io.write_shard(str(folder), "documents", 0, 1, rows, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0123456789abcdef"})
    return qids, rows


@pytest.fixture(scope="package")
def planted(shared_data, tmp_path_factory) -> Planted:
    if not (shared_data / "squad" / "dev-v1.1.json").is_file():
        pytest.skip(f"needs the SQuAD v1.1 dev file at {shared_data / 'squad'}")
    root = tmp_path_factory.mktemp("contamination")
    extract_wikipedia.main(["--input", str(DUMP), "--output", str(root / "wiki")])
    qids, _ = _planted_documents(shared_data, root / "planted")
    build_corpus.main(["--input", f"{root / 'wiki'},{root / 'planted'}",
                       "--output", str(root / "corpus")])
    eval_data = _eval_data(shared_data, root)
    manifest = audit_cli.main([
        "--input", str(root / "corpus"), "--output", str(root / "audit"),
        "--eval_data", str(eval_data), "--tasks", "squad1,rte"])
    passages = frozenset({("planted/a", 1), ("planted/a", 3), ("planted/b", 0),
                          ("planted/c", 0), ("planted/d", 0)})
    return Planted(root / "corpus", eval_data, root / "audit", manifest, qids, passages)
