"""Near-duplicate documents: MinHash over word n-gram shingles, LSH banding, one document kept
per cluster (Broder 1997; the banding of Leskovec, Rajaraman and Ullman, "Mining of Massive
Datasets", ch. 3; settings after Lee et al. 2022, "Deduplicating Training Data Makes Language
Models Better": 5-word shingles, Jaccard 0.8).

A document's text (its passages, normalised as build_corpus's exact dedup does) becomes the set
of its `shingle_size`-word shingles, each hashed to 32 bits (CRC-32 of the words, combined: the
same in every process, never Python's `hash()`), and its signature is the minimum of
`num_perm` multiply-shift hashes over that set: the share of equal signature entries estimates
the Jaccard similarity of two shingle sets. The signature is cut into `bands` bands of
`num_perm / bands` rows; two documents with one equal band are candidates: for Jaccard s, a
pair becomes one with probability 1 - (1 - s^r)^b (r rows, b bands). The defaults (128
permutations, 16 bands of 8) make a pair at 0.9 a candidate with probability 0.9999, at 0.8
0.95, at 0.5 0.06. A candidate pair is confirmed when its signatures' estimated Jaccard is at
least `threshold`.

Within a band bucket, a document is removed when a document with a smaller doc_id is confirmed
similar to it; it names the smallest such one (`cluster_removals`); across buckets, the
smallest named id wins (`resolve`). Every cluster keeps its smallest doc_id, which no one
removes; a chain (a ~ b ~ c, a !~ c) removes b and c, c naming b. The grouping is Beam's
(`NearDuplicatePairs`: a GroupByKey on band keys whose values are doc ids and signatures, never
whole documents), so it runs on Dataflow as on the local runner. A document shorter than
`shingle_size` words is one shingle; an empty one is never a near-duplicate.
"""
from __future__ import annotations

import base64
import hashlib
import unicodedata
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from common.settings import check

_MASK32 = np.uint64(0xFFFFFFFF)
_SHINGLE_BASE = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class NearDuplicateConfig:
    """Near-duplicate removal (build_corpus), after the exact deduplication."""
    shingle_size: int = 5
    """Words per shingle (Lee et al. 2022: 5)."""
    num_perm: int = 128
    """Hash functions of the MinHash signature (more: a finer Jaccard estimate)."""
    bands: int = 16
    """LSH bands the signature is cut into (num_perm / bands rows each); more bands: more
    candidate pairs at lower similarity."""
    threshold: float = 0.8
    """Estimated Jaccard similarity at or above which a candidate pair is a near-duplicate."""
    seed: int = 1
    """Seed of the hash functions."""

    def __post_init__(self):
        check(self.shingle_size >= 1, "shingle_size", f"must be >= 1, got {self.shingle_size}")
        check(self.num_perm >= 1, "num_perm", f"must be >= 1, got {self.num_perm}")
        check(1 <= self.bands <= self.num_perm and self.num_perm % self.bands == 0, "bands",
              f"must divide num_perm ({self.num_perm}), got {self.bands}")
        check(0.0 < self.threshold <= 1.0, "threshold",
              f"must be in (0, 1], got {self.threshold}")

    @property
    def rows(self) -> int:
        return self.num_perm // self.bands

    def candidate_probability(self, similarity: float) -> float:
        """The chance that a pair of Jaccard `similarity` shares a band: 1 - (1 - s^r)^b."""
        return 1.0 - (1.0 - similarity ** self.rows) ** self.bands


def words(passages: Iterable[str]) -> list[str]:
    """The text's words: NFKC, case folded, split on whitespace (build_corpus's normalisation)."""
    return unicodedata.normalize("NFKC", " ".join(passages)).casefold().split()


def shingle_hashes(tokens: list[str], size: int) -> np.ndarray:
    """The distinct 32-bit hashes of the `size`-word shingles (one shingle when shorter)."""
    if not tokens:
        return np.zeros(0, np.uint64)
    ids = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in tokens), np.uint64, len(tokens))
    n = max(1, len(ids) - size + 1)
    combined = np.zeros(n, np.uint64)
    for k in range(min(size, len(ids))):  # a polynomial in the word hashes, wrapping at 2^64
        combined = combined * _SHINGLE_BASE + ids[k:k + n]
    return np.unique((combined ^ (combined >> np.uint64(29))) & _MASK32)


def _permutations(config: NearDuplicateConfig) -> tuple[np.ndarray, np.ndarray]:
    # Multiply-add-shift (Dietzfelbinger): a odd and b over all 64 bits, so a * x + b wraps
    # modulo 2^64 and its top 32 bits are a near-universal hash of the 32-bit shingle x.
    rng = np.random.default_rng(config.seed)
    a = rng.integers(0, 2 ** 64, config.num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2 ** 64, config.num_perm, dtype=np.uint64, endpoint=False)
    return a[:, None], b[:, None]


_CACHE: dict[NearDuplicateConfig, tuple[np.ndarray, np.ndarray]] = {}


def signature(passages: Iterable[str], config: NearDuplicateConfig) -> np.ndarray | None:
    """The MinHash signature (num_perm uint32) of a text; None for a text without words."""
    shingles = shingle_hashes(words(passages), config.shingle_size)
    if len(shingles) == 0:
        return None
    if config not in _CACHE:
        _CACHE[config] = _permutations(config)
    a, b = _CACHE[config]
    with np.errstate(over="ignore"):  # the wrap modulo 2^64 is the hash
        hashed = (a * shingles[None, :] + b) >> np.uint64(32)
    return hashed.min(axis=1).astype(np.uint32)


def band_keys(sig: np.ndarray, config: NearDuplicateConfig) -> list[str]:
    """One key per band: its index and a hash of its rows (equal keys: an equal band)."""
    rows = config.rows
    return [f"{band}:{hashlib.blake2b(sig[band * rows:(band + 1) * rows].tobytes(), digest_size=8).hexdigest()}"
            for band in range(config.bands)]


def encode(sig: np.ndarray) -> str:
    """A signature as text (it crosses Beam's shuffles and the waves' scratch files)."""
    return base64.b64encode(sig.astype("<u4").tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4")


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a == b))


def cluster_removals(members: Iterable[tuple[str, np.ndarray]], config: NearDuplicateConfig
                     ) -> list[tuple[str, str]]:
    """(removed doc_id, the doc_id it duplicates) within one band bucket: a document is removed
    when one with a smaller doc_id is confirmed similar; it names the smallest such one."""
    ordered = sorted({doc_id: sig for doc_id, sig in members}.items())
    removed = []
    for i, (doc_id, sig) in enumerate(ordered):
        for other_id, other in ordered[:i]:
            if estimated_jaccard(sig, other) >= config.threshold:
                removed.append((doc_id, other_id))
                break
    return removed


def resolve(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """removed doc_id -> the smallest doc_id it was found to duplicate (over all buckets)."""
    found: dict[str, str] = {}
    for removed, kept in pairs:
        if removed not in found or kept < found[removed]:
            found[removed] = kept
    return found
