"""Real pre-training shards for the training tests, made from the shared books corpus.

A small WordPiece vocabulary trained on the books (HF `tokenizers`; a 2000-token MLM head keeps
CPU steps fast), the books as reference-format text (blingfire sentences), then the real Beam
job `pipelines.make_shards` for both phases. `write_shards` re-shards the pipeline's rows into
exact (uneven) shard sizes for the loader tests, in the same format and manifest layout.
"""
from __future__ import annotations

import functools
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from common import shard_format, storage

BOOKS = ("austen-emma.txt", "austen-persuasion.txt", "chesterton-brown.txt",
         "chesterton-thursday.txt", "melville-moby_dick.txt", "whitman-leaves.txt")


def write_shards(rows: list[shard_format.Row], out_dir: Path, split_sizes: dict[str, list[int]],
                 vocab_size: int, max_seq_length: int, rows_per_block: int = 32) -> dict:
    """Write `{split}-NNNNNN.tar` shards with the given row counts, then the manifest (last)."""
    import webdataset as wds

    os.makedirs(out_dir, exist_ok=True)
    entries, start = [], 0
    for split, sizes in split_sizes.items():
        for index, size in enumerate(sizes):
            shard_rows = rows[start:start + size]
            assert len(shard_rows) == size, f"only {len(rows)} rows for shards {split_sizes}"
            start += size
            name = f"{split}-{index:06d}.tar"
            with wds.TarWriter(str(out_dir / name)) as sink:
                for block, first in enumerate(range(0, size, rows_per_block)):
                    sink.write({"__key__": f"{index:06d}-{block:06d}",
                                shard_format.MEMBER_SUFFIX: shard_format.encode_block(
                                    shard_rows[first:first + rows_per_block], vocab_size)})
            entries.append({"name": name, "num_rows": size, "num_instances": size,
                            "sha256": storage.sha256_file(str(out_dir / name))})
    manifest = {"shards": entries, "max_seq_length": max_seq_length, "vocab_size": vocab_size,
                "packed": False, "nsp": True}
    storage.write_manifest(str(out_dir), manifest)
    return manifest


def train_small_vocab(books_dir: Path, out_dir: Path, vocab_size: int = 2000) -> Path:
    """A small uncased WordPiece vocabulary of the books (fast MLM heads for CPU tests)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from common.tokenization import SPECIAL_TOKENS, bert_normalizer, save_tokenizer_folder

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = bert_normalizer(True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                        show_progress=False)
    lines = (line for name in BOOKS
             for line in (books_dir / name).read_text(encoding="utf-8", errors="replace")
             .splitlines())
    tokenizer.train_from_iterator(lines, trainer)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    save_tokenizer_folder([token for token, _ in vocab], str(out_dir))
    return out_dir


@dataclass(frozen=True)
class BookShards:
    """Shards of the books made by the real pipeline (`pipelines.make_shards`)."""
    vocab_dir: Path
    shards_128: Path
    """4 train + 4 validation shards, unpacked rows of <= 128 tokens."""
    shards_512: Path
    """2 train + 2 validation shards, packed rows of <= 512 tokens."""
    rows_128: tuple
    """The train rows of `shards_128` in shard order (for re-sharding into exact sizes)."""


def write_corpus_text(books_dir: Path, out_dir: Path, names: tuple[str, ...] = BOOKS,
                      paragraphs_per_book: int | None = None) -> Path:
    """The books (their first `paragraphs_per_book` paragraphs, or all) in the reference text
    format: one sentence per line, documents of 8 paragraphs separated by blank lines."""
    import blingfire

    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        text = (books_dir / name).read_text(encoding="utf-8", errors="replace")
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n")
                      if p.strip()][:paragraphs_per_book]
        docs = [blingfire.text_to_sentences(" ".join(paragraphs[s:s + 8]))
                for s in range(0, len(paragraphs), 8)]
        (out_dir / name).write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return out_dir


def read_rows(folder: Path, split: str = "train") -> list[shard_format.Row]:
    rows = []
    for shard in sorted(folder.glob(f"{split}-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                rows += shard_format.decode_block(tar.extractfile(member).read())
    return rows


@functools.cache
def book_shards(books_dir: Path, root: Path) -> BookShards:
    """Vocabulary, corpus text and both phases' shards, built once per test session."""
    from pipelines import make_shards

    vocab_dir = train_small_vocab(books_dir, root / "vocab")
    corpus = write_corpus_text(books_dir, root / "corpus")
    common = ["--input", str(corpus), "--vocab", str(vocab_dir), "--dupe_factor", "1",
              "--validation_fraction", "0.05"]
    make_shards.main([*common, "--output", str(root / "shards_128"), "--num_shards", "4",
                     "--max_seq_length", "128", "--max_predictions_per_seq", "20"])
    make_shards.main([*common, "--output", str(root / "shards_512"), "--num_shards", "2",
                     "--max_seq_length", "512", "--max_predictions_per_seq", "76", "--pack"])
    return BookShards(vocab_dir, root / "shards_128", root / "shards_512",
                      tuple(read_rows(root / "shards_128")))


def book_corpus(books_dir: Path, out_dir: Path, paragraphs: int) -> Path:
    """Two books' first `paragraphs` paragraphs in the reference text format."""
    return write_corpus_text(books_dir, out_dir, ("austen-persuasion.txt",
                                                  "chesterton-thursday.txt"), paragraphs)
