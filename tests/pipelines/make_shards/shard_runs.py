"""Running the make_shards job on the test corpus and reading its shard files back."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipelines import make_shards


def book_documents(books: Path, name: str, paragraphs: int = 240, per_doc: int = 12) -> list[list[str]]:
    """Documents of `per_doc` paragraphs from the start of a book, one sentence per entry."""
    import blingfire

    text = (books / name).read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
    paras = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()][:paragraphs]
    return [blingfire.text_to_sentences(" ".join(paras[s:s + per_doc])).split("\n")
            for s in range(0, len(paras), per_doc)]


def _run(corpus_dir, out, minilm_dir, *extra) -> dict:
    return make_shards.main([
        "--input", str(corpus_dir), "--vocab", str(minilm_dir), "--output", str(out),
        "--dupe_factor", "2", "--num_shards", "3", "--rows_per_block", "64",
        "--instances_per_pack_bucket", "300", "--join_buckets", "7", *extra])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shard_files(folder: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted(folder.iterdir()) if p.suffix in (".tar", ".jsonl")}


def _reference_run(inputs, out, vocab, *extra) -> dict:
    return make_shards.main(["--input", str(inputs), "--vocab", str(vocab), "--output", str(out),
                            "--mode", "reference", "--dupe_factor", "1", "--num_shards", "1",
                            *extra])
