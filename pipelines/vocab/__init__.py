"""Vocabulary training's pure functions, a module per kind (`vocab.kind`): `wordpiece` (BERT's)
and `bpe` (byte-level). `pipelines/train_vocab.py` wires them into Beam through `KINDS`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VocabKind:
    """What train_vocab needs of a kind: how text splits into the words it counts, and how a
    vocabulary (`.tokens`, `.stats`, and `.merges` for a BPE) is learned from their counts."""
    word_splitter: Callable[[bool], Callable[[str], list[str]]]
    train_vocab: Callable[..., Any]


def kinds() -> dict[str, VocabKind]:
    """`vocab.kind` -> its functions (one line a kind)."""
    from pipelines.vocab import bpe, wordpiece

    return {"wordpiece": VocabKind(wordpiece.word_splitter, wordpiece.train_vocab),
            "bpe": VocabKind(bpe.word_splitter, bpe.train_vocab)}
