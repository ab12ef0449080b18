"""A data source: what a user declares once for their own text (flow `data.sources`, the
extract_documents job, build_corpus's mixture).

A source has a name (its documents' `source` column and doc_id prefix, `<name>/<id>`), a kind
(how its files are read), a path (file, glob or folder; several separated by commas; local or
any Beam filesystem), a field map (`text_field`, optional `id_field` and `title_field`), a
`weight` and a `licence` label. `wikipedia` and `books` are read by their own jobs; the other
kinds by pipelines/extract_documents.py.

The weight is a document sampling factor, applied by build_corpus after exact deduplication
(`copies`): a document is kept `floor(weight)` times, plus once more when a hash of (source
name, doc_id) falls below the fractional part. So 0.5 keeps about half the documents, the same
half on every run; 3 keeps each document three times (the copies get the doc_ids `<id>#r1`,
`<id>#r2`). Applied after deduplication because the copies are exact duplicates by design:
applied before, deduplication would remove them again.

`quality` opts a source into the quality filters (pipelines/corpus/quality.py): unset (None, the
default of every source, wikipedia and books included) its documents are not filtered; a
mapping sets the thresholds, each unset one at the Gopher paper's value and 0 turning one off.
In a sources JSON list: `{"name": "news", "kind": "jsonl", "path": "...", "quality":
{"min_words": 50, "languages": ["en"], "min_stop_words": 2}}`; in the flow:
`--set data.sources.news.quality.languages=en`.
"""
from __future__ import annotations

import hashlib
import math
import re
import typing
from dataclasses import dataclass
from typing import Literal

from common import settings
from pipelines.corpus.quality import QualityConfig

Kind = Literal["wikipedia", "books", "text", "jsonl", "parquet", "csv", "tsv", "hf_datasets"]
KINDS: tuple[str, ...] = typing.get_args(Kind)
GENERIC_KINDS = KINDS[2:]
"""The kinds pipelines/extract_documents.py reads (wikipedia and books have their own jobs)."""
RESERVED_NAMES = ("wiki", "wikipedia", "books")
"""doc_id prefixes and `source` labels of the wikipedia and books jobs."""
REPEAT_MARK = "#r"
"""doc_id of the k-th extra copy of a weighted document: `<doc_id>#r<k>`."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_REPEAT = re.compile(rf"{re.escape(REPEAT_MARK)}\d+$")


@dataclass(frozen=True)
class SourceConfig:
    """One source of documents."""
    name: str
    """Its label: the documents' `source` column and doc_id prefix (letters, digits, _ . -);
    a wikipedia source is named wikipedia, a books source books."""
    kind: Kind
    """How its files are read: wikipedia (MediaWiki dump), books (book cleaner), text (plain
    text files), jsonl, parquet, csv, tsv, hf_datasets (a save_to_disk folder's Arrow files)."""
    path: str
    """A file, glob or folder (local or gs://...); several separated by commas."""
    text_field: str = "text"
    """The field (column) holding the text (jsonl, parquet, csv, tsv, hf_datasets)."""
    id_field: str = ""
    """The field holding a document id; "" numbers documents by file and line/row."""
    title_field: str = ""
    """The field holding the title; "" leaves titles empty."""
    split: Literal["file", "blank_line", "line"] = "file"
    """text kind: one document per file, per block of lines between blank lines, or per
    non-empty line (a corpus of one document a line)."""
    weight: float = 1.0
    """Document sampling factor after deduplication: 0.5 keeps about half the documents
    (by a hash of the doc_id), 3 keeps each three times."""
    licence: str = ""
    """Licence or provenance label, carried into the corpus manifest and the report."""
    quality: QualityConfig | None = None
    """Quality filters for its documents (pipelines/corpus/quality.py: length bounds, language,
    the Gopher rules), e.g. {"min_words": 50, "languages": ["en"]}; unset: no filtering."""

    def __post_init__(self):
        settings.check_choices(self)
        settings.check(bool(_NAME.fullmatch(self.name)), "name",
                       f"{self.name!r}: letters, digits, _ . - (starting with a letter or digit)")
        if self.kind in ("wikipedia", "books"):
            settings.check(self.name == self.kind, "name",
                           f"a {self.kind} source is named {self.kind!r} (its job labels its "
                           f"documents so), got {self.name!r}")
        else:
            settings.check(self.name not in RESERVED_NAMES, "name",
                           f"{self.name!r} is the label of the wikipedia and books jobs' "
                           "documents: choose another name")
        settings.check(bool(self.path.strip()), "path", "is empty")
        settings.check(bool(self.text_field), "text_field", "is empty")
        settings.check(self.weight > 0, "weight", f"must be > 0, got {self.weight}")

    @property
    def generic(self) -> bool:
        """Read by extract_documents (not the wikipedia or books job)."""
        return self.kind in GENERIC_KINDS


def unit_hash(source: str, doc_id: str) -> float:
    """A number in [0, 1) fixed by (source, doc_id): the sampling draw of a document."""
    digest = hashlib.sha256(f"{source}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def copies(source: str, doc_id: str, weight: float) -> int:
    """How many times a document is kept under `weight` (see the module docstring)."""
    whole = math.floor(weight)
    return whole + (1 if unit_hash(source, doc_id) < weight - whole else 0)


def copy_ids(source: str, doc_id: str, weight: float) -> list[str]:
    """The doc_ids of a document's copies: itself, then `<doc_id>#r1`, `#r2`, ..."""
    return [doc_id if k == 0 else f"{doc_id}{REPEAT_MARK}{k}"
            for k in range(copies(source, doc_id, weight))]


def original_id(doc_id: str) -> str:
    """The doc_id a copy was made from (the doc_id itself when it is no copy)."""
    return _REPEAT.sub("", doc_id)
