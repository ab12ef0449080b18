"""The Wikipedia extraction job's runs and outputs as the tests read them, and what the real enwiki
excerpt holds."""

from __future__ import annotations

import bz2
import itertools
import json
import re
from pathlib import Path

import pyarrow.parquet as pq

from pipelines import extract_wikipedia
from pipelines.corpus.documents import DOCUMENT_SCHEMA

REPO = Path(__file__).resolve().parents[3]


# The 23 articles of the dump: 27 pages minus 2 redirects, 1 disambiguation, 1 Category page.
ARTICLES = [
    "? (film)", "Angela Merkel", "Arthur Schopenhauer", "Asda", "Atlantic Ocean", "Berlin",
    "Borysthenia goldfussiana", "Dahlak SC", "Ferdinand Piëch", "IBM", "IKEA", "Ingoldiomyces",
    "Jim Pewter", "Kerala Agricultural University", "Marian Breland Bailey", "Mini (Mark I)",
    "N.EX.T", "Ranma ½", "Redd Kross", 'Ren & Stimpy "Adult Party Cartoon"', "Samsung",
    "The Ren & Stimpy Show", "Vehicle registration plates of China",
]


NUM_PASSAGES = 1185  # as test_wikitext.py counts them on the same dump


RESIDUE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|'''|==|<!--|-->|</?[A-Za-z][^<>]*>"
                     r"|&(?:[a-z]+|#\d+);|(?m:^[*#;:|!])")


# The debug preset: one split per bz2 stream, 4-document row groups.
DEBUG_ARGS = [f"--{name}={value}" for name, value in
              sorted(vars(extract_wikipedia.tiny()).items())]


def run_job(input_path, output, *extra) -> dict:
    return extract_wikipedia.main(["--input", str(input_path), "--output", str(output), *extra])


def read_documents(output: Path) -> list[dict]:
    rows = []
    for path in sorted(output.glob("documents-*.parquet")):
        table = pq.read_table(path)
        assert table.schema.equals(DOCUMENT_SCHEMA, check_metadata=False), path
        rows.extend(table.to_pylist())
    return rows


def dead_letters(output: Path) -> list[dict]:
    files = sorted((output / "dead_letter").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def without_source(rows: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in row.items() if k != "source_file"} for row in rows),
                  key=lambda row: row["doc_id"])


def build_multistream(xml: bytes, folder: Path, pages_per_stream: int = 5) -> Path:
    """A pages-articles-multistream.xml.bz2 as Wikimedia builds it: header, N pages, footer."""
    starts = [m.start() for m in re.finditer(rb"<page>", xml)]
    footer = xml.rindex(b"</mediawiki>")
    cuts = [0, *starts[::pages_per_stream], footer, len(xml)]
    path = folder / "mini-multistream.xml.bz2"
    path.write_bytes(b"".join(bz2.compress(xml[a:b]) for a, b in itertools.pairwise(cuts)))
    return path
