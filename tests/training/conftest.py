"""The training tests' shards: the books' shards made by pipelines.make_shards (the loader's
training rows, and pre-training's shards re-sharded unevenly)."""

from __future__ import annotations

import pytest

from tests.support.shard_fixtures import book_shards, write_shards

UNEVEN = [20, 12, 28, 15, 9]  # 2 slots: 28+12 | 20+15+9 -> 40 rows each = 10 batches of 4


@pytest.fixture(scope="package")
def data(shared_data, tmp_path_factory):
    """Shards made by pipelines.make_shards from the books: `learn` (128 tokens, 4 shards),
    `long` (512 tokens, packed), `uneven` (its rows re-sharded into 5 uneven tiny shards)."""
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    vocab_size = len((made.vocab_dir / "vocab.txt").read_text().split())
    uneven = tmp_path_factory.getbasetemp() / "uneven_shards"
    if not (uneven / "manifest.json").exists():
        write_shards(list(made.rows_128), uneven, {"train": UNEVEN, "validation": [16]},
                     vocab_size, 128, rows_per_block=16)
    return {"vocab": made.vocab_dir, "learn": made.shards_128, "long": made.shards_512,
            "uneven": uneven}


@pytest.fixture(scope="session")
def books(shared_data, tmp_path_factory):
    """(vocabulary folder, train rows made by pipelines.make_shards from the books)."""
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    return made.vocab_dir, made.rows_128
