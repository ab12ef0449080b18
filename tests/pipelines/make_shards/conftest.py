"""The make_shards tests' corpus (reference-format text and corpus Parquet) and one job run on it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.corpus.documents import CORPUS_SCHEMA
from tests.pipelines.make_shards.shard_runs import (
    _run,
    book_documents,
)

BOOKS = ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-caesar.txt")


@pytest.fixture(scope="package")
def corpus(shared_data, tmp_path_factory) -> dict:
    """The same documents as reference-format text files and as corpus Parquet files."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "text").mkdir()
    (root / "parquet").mkdir()
    # Every file ends with a blank line, so it holds the same documents as its Parquet twin in
    # reference mode too (the reference reads on across files; the sample ends without one).
    (root / "text" / "a-sample.txt").write_bytes(
        (shared_data / "reference" / "sample_text.txt").read_bytes() + b"\n")
    sample_docs = (shared_data / "reference" / "sample_text.txt").read_text().split("\n\n")
    all_docs = {"a-sample": [[s for s in d.split("\n") if s.strip()] for d in sample_docs]}
    for name in BOOKS:
        docs = book_documents(shared_data / "books", name)
        stem = "b-" + name.removesuffix(".txt")
        all_docs[stem] = docs
        (root / "text" / f"{stem}.txt").write_text("".join("\n".join(d) + "\n\n" for d in docs))
    for i, (stem, docs) in enumerate(sorted(all_docs.items())):
        docs = [d for d in docs if d]
        table = pa.Table.from_pylist([{
            "doc_id": f"books/{stem}/{j}", "source": "books", "source_file": stem, "title": stem,
            "passages": [" ".join(d)], "sentences": d} for j, d in enumerate(docs)],
            schema=CORPUS_SCHEMA)
        pq.write_table(table, root / "parquet" / f"corpus-{i:05d}-of-{len(all_docs):05d}.parquet")
    return {"text": root / "text", "parquet": root / "parquet"}


@pytest.fixture(scope="package")
def one_worker(corpus, minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "shards"
    return out, _run(corpus["text"], out, minilm_dir)
