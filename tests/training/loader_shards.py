"""Shards of the books' rows for the loader tests, and how the tests key and compare their rows."""

from __future__ import annotations

from pathlib import Path

from tests.support.shard_fixtures import write_shards

SEQ = 128


def _shards(books, folder: Path, train: list[int], validation: list[int] = ()) -> Path:
    vocab_dir, rows = books
    write_shards(list(rows), folder, {"train": train, "validation": list(validation)},
                 vocab_size=len((vocab_dir / "vocab.txt").read_text().split()),
                 max_seq_length=SEQ, rows_per_block=16)
    return folder


def _row_key(batch: dict, i: int) -> tuple:
    n = int(batch["attention_mask"][i].sum())
    return tuple(batch["input_ids"][i, :n].tolist())


def layout_tensors(layout) -> tuple:
    """A BatchLayout as nested lists, for comparing two of them."""
    if layout.plan is None:
        return (layout.masked, None)
    groups = [(g.index.tolist(), None if g.real is None else g.real.tolist())
              for g in layout.plan.groups]
    return (layout.masked, groups, layout.plan.token_index.tolist())
