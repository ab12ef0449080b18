"""Words and n-grams for the contamination audit, as GPT-3's overlap study defines them.

Brown et al. 2020 ("Language Models are Few-Shot Learners", appendix C) count a gram as "a
lowercase, whitespace delimited word with no punctuation", and filter training text on 13-gram
collisions with every test and development set; EleutherAI's lm-evaluation-harness
(`lm_eval/decontamination/janitor.py`) does the same with Python's `string.punctuation` deleted
(which holds ASCII symbols such as `$`, `+`, `|` too). Here:

- `words(text)`: NFKC, lower case, every Unicode punctuation or symbol character deleted
  (categories P* and S*: ASCII's set and its Unicode kin, so "U.S." is "us" and "don't" is
  "dont"), then split on whitespace. A token of punctuation only disappears, so CoNLL's
  tokenized "U.S. , said" and running text "U.S., said" give the same words.
- `ngram_hashes(words, n)`: one stable 64-bit hash per n-gram (every window of n consecutive
  words), never Python's `hash()` (salted per process): each word is hashed once with BLAKE2b
  (8 bytes), and a window's hash is the polynomial of its word hashes modulo 2**64, computed
  for all windows at once with numpy. Equal n-grams hash equally in every process and run.
- `text_ngrams(texts, n)`: the set of n-gram hashes of one example's text fields; a gram never
  spans two fields. A field shorter than n words has none.
"""
from __future__ import annotations

import functools
import hashlib
import sys
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

DEFAULT_NGRAM = 13
"""GPT-3's filtering size (appendix C), also lm-evaluation-harness's default."""
_MULTIPLIER = np.uint64(0x100000001B3)
"""The 64-bit FNV prime: odd, so each step of the polynomial is a bijection modulo 2**64."""


@functools.cache
def _deletions() -> dict[int, None]:
    """str.translate's table deleting every punctuation (P*) and symbol (S*) code point."""
    return {c: None for c in range(sys.maxunicode + 1)
            if unicodedata.category(chr(c))[0] in "PS"}


def normalize(text: str) -> str:
    """NFKC, lower case, punctuation and symbols deleted (whitespace kept)."""
    return unicodedata.normalize("NFKC", text).lower().translate(_deletions())


def words(text: str) -> list[str]:
    """The words of `text` as the audit compares them (`normalize`, split on whitespace)."""
    return normalize(text).split()


@functools.lru_cache(maxsize=1 << 20)
def word_hash(word: str) -> int:
    """A word's stable 64-bit hash (BLAKE2b, 8 bytes, big-endian)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big")


def ngram_hashes(tokens: Sequence[str], n: int) -> np.ndarray:
    """(max(0, len(tokens) - n + 1),) uint64: the hash of every window of `n` words, in order."""
    count = len(tokens) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    each = np.fromiter((word_hash(w) for w in tokens), dtype=np.uint64, count=len(tokens))
    hashes = np.zeros(count, dtype=np.uint64)
    for offset in range(n):
        hashes = hashes * _MULTIPLIER + each[offset:offset + count]  # wraps modulo 2**64
    return hashes


def text_ngrams(texts: Iterable[str], n: int) -> np.ndarray:
    """The distinct n-gram hashes of an example's text fields, sorted (uint64)."""
    parts = [ngram_hashes(words(t), n) for t in texts]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)


def ngram_text(tokens: Sequence[str], start: int, n: int) -> str:
    """The n-gram at `start` as its words joined by spaces (what the side output shows)."""
    return " ".join(tokens[start:start + n])
