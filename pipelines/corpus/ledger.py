"""The corpus's mixture ledger (build_corpus's manifest `ledger`): per source, what its
extraction job read (from the input folders' manifests), what build_corpus took in, dropped,
repeated and wrote (its ledger counters, `build.LEDGER_COUNTS`), and its share of the corpus."""
from __future__ import annotations

from collections.abc import Sequence

from common import storage
from pipelines.corpus.build import LEDGER_COUNTS
from pipelines.documents.source import SourceConfig


def extraction_counts(folders: dict[str, str]) -> dict[str, dict]:
    """What each source's extraction job read, from the input folders' manifests: records read,
    bad records, input bytes (and licence where declared), by source name."""
    found: dict[str, dict] = {}
    for folder in folders:
        manifest = storage.read_manifest(folder) or {}
        counts = manifest.get("counts", {})
        inputs = sum(i.get("bytes", i.get("size_bytes", 0)) for i in manifest.get("inputs", []))
        if manifest.get("stage") == "extract_documents":
            for name, entry in manifest.get("sources", {}).items():
                found[name] = {k: entry[k] for k in ("records_read", "bad_records",
                                                     "input_bytes", "licence")}
        elif manifest.get("stage") == "extract_books":
            found["books"] = {"records_read": counts.get("files_read", 0),
                              "bad_records": counts.get("bad_records", 0), "input_bytes": inputs}
        elif manifest.get("stage") == "extract_wikipedia":
            found["wikipedia"] = {"records_read": counts.get("pages_read", 0),
                                  "bad_records": counts.get("bad_records", 0),
                                  "input_bytes": inputs}
    return found


def build_ledger(sources: Sequence[SourceConfig], extracted: dict[str, dict],
                 counts: dict[str, dict[str, int]]) -> dict[str, dict]:
    """The mixture ledger: per source, its declaration, what its extraction read, what this job
    took in, dropped, repeated and wrote, and its share of the corpus."""
    declared = {s.name: s for s in sources}
    total_docs = sum(c["documents_out"] for c in counts.values()) or 1
    total_bytes = sum(c["bytes_out"] for c in counts.values()) or 1
    ledger = {}
    for name in sorted(counts.keys() | declared.keys()):
        row = counts.get(name, dict.fromkeys(LEDGER_COUNTS, 0))
        source = declared.get(name)
        read = extracted.get(name, {})
        ledger[name] = {
            "weight": source.weight if source else 1.0,
            "licence": (source.licence if source else "") or read.get("licence", ""),
            "records_read": read.get("records_read"), "bad_records": read.get("bad_records"),
            "input_bytes": read.get("input_bytes"),
            **row,
            "share_documents": round(row["documents_out"] / total_docs, 4),
            "share_bytes": round(row["bytes_out"] / total_bytes, 4)}
    return ledger

