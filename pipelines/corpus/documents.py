"""The document record every extraction job writes and every later stage reads."""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

DOCUMENT_SCHEMA = pa.schema([
    # unique and stable: "wiki/<page id>", "books/<path below the input folder, no extension>"
    ("doc_id", pa.string()),
    ("source", pa.string()),        # "wikipedia" | "books"
    ("source_file", pa.string()),   # the input file it came from
    ("title", pa.string()),
    ("passages", pa.list_(pa.string())),  # clean text, one per paragraph
])

CORPUS_SCHEMA = DOCUMENT_SCHEMA.append(pa.field("sentences", pa.list_(pa.string())))


@dataclass(frozen=True)
class Document:
    doc_id: str
    source: str
    source_file: str
    title: str
    passages: tuple[str, ...]
    sentences: tuple[str, ...] = field(default=())

    def to_record(self) -> dict:
        record = {"doc_id": self.doc_id, "source": self.source, "source_file": self.source_file,
                  "title": self.title, "passages": list(self.passages)}
        if self.sentences:
            record["sentences"] = list(self.sentences)
        return record
