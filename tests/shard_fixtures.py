"""Real pre-training shards for the training tests, made from the shared books corpus.

Until `pipelines/make_shards.py` lands this builds BERT instances directly (sentences from
blingfire, the MiniLM WordPiece vocabulary through `pipelines.tokenization`, A/B segments with
50% random next, 15% masking 80/10/10) and writes them in the shard format of
`pipelines/shard_format.py` with webdataset's TarWriter, plus the manifest the loader reads.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from pipelines import shard_format, storage
from pipelines.tokenization import CLS, MASK, SEP, load_tokenizer, read_vocab

BOOKS = ("austen-emma.txt", "austen-persuasion.txt", "chesterton-brown.txt",
         "chesterton-thursday.txt", "melville-moby_dick.txt", "whitman-leaves.txt")


def book_documents(books_dir: Path, vocab_dir: Path, max_chars: int = 2_000_000) -> list[list]:
    """Documents (lists of token-id arrays, one per sentence): paragraphs of the books."""
    import blingfire

    tokenizer = load_tokenizer(str(vocab_dir))
    docs = []
    for name in BOOKS:
        text = (books_dir / name).read_text(encoding="utf-8", errors="replace")[:max_chars]
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        # A document = 8 consecutive paragraphs (books are long; NSP needs many documents).
        for start in range(0, len(paragraphs), 8):
            sentences = blingfire.text_to_sentences(" ".join(paragraphs[start:start + 8]))
            encoded = tokenizer.encode_batch(sentences.split("\n"), add_special_tokens=False)
            doc = [np.array(e.ids, np.int32) for e in encoded if e.ids]
            if len(doc) >= 2:
                docs.append(doc)
    return docs


def make_rows(docs: list[list], vocab_dir: Path, max_seq_length: int, seed: int,
              max_predictions: int) -> list[shard_format.Row]:
    """One unpacked row per instance: [CLS] A [SEP] B [SEP], masked 80/10/10."""
    vocab = read_vocab(str(vocab_dir))
    ids = {t: i for i, t in enumerate(vocab)}
    rng = np.random.default_rng(seed)
    rows = []
    budget = max_seq_length - 3
    for d, doc in enumerate(docs):
        chunk: list[np.ndarray] = []
        for sentence in doc:
            chunk.append(sentence)
            if sum(len(s) for s in chunk) < budget and sentence is not doc[-1]:
                continue
            if len(chunk) >= 2 or rng.random() < 0.5:
                rows.append(_instance(chunk, docs, d, rng, budget, ids, len(vocab),
                                      max_predictions))
            chunk = []
    return rows


def _instance(chunk, docs, d, rng, budget, ids, vocab_size, max_predictions) -> shard_format.Row:
    split = int(rng.integers(1, len(chunk))) if len(chunk) > 1 else 1
    a = np.concatenate(chunk[:split])
    if len(chunk) == 1 or rng.random() < 0.5:
        other = docs[(d + 1 + int(rng.integers(len(docs) - 1))) % len(docs)]
        b, label = np.concatenate(other[int(rng.integers(len(other))):]), 1
    else:
        b, label = np.concatenate(chunk[split:]), 0
    while len(a) + len(b) > budget:  # truncate the longer side, as the reference does
        if len(a) > len(b):
            a = a[1:] if rng.random() < 0.5 else a[:-1]
        else:
            b = b[1:] if rng.random() < 0.5 else b[:-1]
    tokens = np.concatenate([[ids[CLS]], a, [ids[SEP]], b, [ids[SEP]]]).astype(np.int64)
    segments = np.concatenate([np.zeros(len(a) + 2), np.ones(len(b) + 1)]).astype(np.uint8)
    candidates = np.flatnonzero((tokens != ids[CLS]) & (tokens != ids[SEP]))
    count = min(max_predictions, max(1, round(len(tokens) * 0.15)), len(candidates))
    positions = np.sort(rng.choice(candidates, size=count, replace=False))
    original = tokens[positions].copy()
    draw = rng.random(count)
    tokens[positions] = np.where(draw < 0.8, ids[MASK],
                                 np.where(draw < 0.9, rng.integers(0, vocab_size, count), original))
    return shard_format.Row(tokens, segments, np.zeros(len(tokens), np.uint8), positions,
                            original, np.array([label], np.int8))


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

    from pipelines.tokenization import SPECIAL_TOKENS, bert_normalizer, save_tokenizer_folder

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


@functools.cache
def book_data(books_dir: Path, root: Path, max_seq_length: int = 128,
              max_predictions: int = 20) -> tuple[Path, tuple[shard_format.Row, ...]]:
    """(small vocabulary folder, rows of the books), built once per test session."""
    vocab_dir = train_small_vocab(books_dir, root / "vocab")
    docs = book_documents(books_dir, vocab_dir)
    return vocab_dir, tuple(make_rows(docs, vocab_dir, max_seq_length, 1, max_predictions))
