"""Near-duplicate documents: MinHash over word n-gram shingles, LSH banding, one document kept
per cluster (Broder 1997; the banding of Leskovec, Rajaraman and Ullman, "Mining of Massive
Datasets", ch. 3; settings after Lee et al. 2022, "Deduplicating Training Data Makes Language
Models Better": 5-word shingles, Jaccard 0.8).

Pure functions, no Beam: `pipelines/corpus/remove_near_duplicates.py` wires them into Beam
transforms (`NearDuplicatePairs`, `RemoveNearDuplicates`), kept apart so that declaring the
setting (`NearDuplicateConfig`, in the flow's config) does not import Beam.

Shingles: a text (its passages, normalised as build_corpus's exact dedup does: NFKC, case
folded, split on whitespace) becomes the set of its `shingle_size`-word shingles, each hashed
to 32 bits (CRC-32 of each word, combined: the same in every process and on every worker, never
Python's salted `hash()`); `shingles(text, n)` is that set. A text shorter than `shingle_size`
words is one shingle of all its words; a text without words has no shingle and no signature,
so it is never a near-duplicate.

Signature: the minimum of `num_perm` multiply-shift hashes over the shingle set (`minhash`); the
share of equal entries of two signatures estimates the Jaccard similarity of the two shingle
sets (`estimated_jaccard`; its standard error at 0.8 with 128 entries is 0.035).

Banding, the S-curve: the signature is cut into `bands` bands of r = `num_perm / bands` rows;
two documents with one equal band are candidates. For Jaccard s a pair becomes one with
probability 1 - (1 - s^r)^b (`NearDuplicateConfig.candidate_probability`). The defaults (128
permutations, 16 bands of 8) put the curve's steep part (about (1/b)^(1/r) = 0.71) below the
0.8 threshold: a pair at 0.9 is a candidate with probability 0.9999, at 0.8 0.95, at 0.5 0.06,
at 0.3 0.001. So nearly every pair that matters reaches a bucket, while unrelated pairs rarely
do (fewer confirmations to compute). A candidate pair is confirmed when its full signatures'
estimated Jaccard is at least `threshold`. Measured against exact Jaccard on 3,000 book
windows + 900 edited copies (benchmarks/bench_near_duplicates.py): recall 1.0 at J >= 0.9,
0.91 at J >= 0.8; of the documents removed, 92% have exact J >= 0.8 with the one they name and
all have J >= 0.75 (the estimate's noise right at the threshold; with scattered edits only, all
have J >= 0.8).

What 0.8 means: each edited word changes up to `shingle_size` shingles, so scattered edits
lower the Jaccard fast: a fraction p of words replaced at random gives about
q / (2 - q) with q = (1 - p)^5, i.e. 0.9 at 1%, 0.82 at 2%, 0.75 at 3%, 0.63 at 5%; the same
share edited in one run of words (a changed clause, a header, a date) costs far less (3% of
200 words in one run: 0.90).

Clusters: within a band bucket, a document is removed when a document with a smaller doc_id is
confirmed similar to it; it names the smallest such one (`cluster_removals`); across buckets,
the smallest named doc_id wins (`resolve`). A kept id may itself be removed by another pair: a
chain a ~ b ~ c with a !~ c removes b and c, c naming b (b naming a). Every cluster keeps at
least its smallest doc_id, which nothing removes (no smaller id exists to name), so no
document is lost without a kept document it (transitively) duplicates.
"""
from __future__ import annotations

import base64
import hashlib
import unicodedata
import zlib
from collections.abc import Collection, Iterable
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
        check(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")

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
    """The distinct 32-bit hashes (uint64 array, sorted) of the `size`-word shingles of
    `tokens` (one shingle when shorter; none without tokens)."""
    if not tokens:
        return np.zeros(0, np.uint64)
    ids = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in tokens), np.uint64, len(tokens))
    n = max(1, len(ids) - size + 1)
    combined = np.zeros(n, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(min(size, len(ids))):  # a polynomial in the word hashes, wrapping at 2^64
            combined = combined * _SHINGLE_BASE + ids[k:k + n]
    return np.unique((combined ^ (combined >> np.uint64(29))) & _MASK32)


def shingles(text: str, n: int) -> set[int]:
    """The set of 32-bit hashes of `text`'s `n`-word shingles (after `words`); the sets whose
    Jaccard similarity the signatures estimate."""
    return set(shingle_hashes(words([text]), n).tolist())


def _permutations(config: NearDuplicateConfig) -> tuple[np.ndarray, np.ndarray]:
    # Multiply-add-shift (Dietzfelbinger): a odd and b over all 64 bits, so a * x + b wraps
    # modulo 2^64 and its top 32 bits are a near-universal hash of the 32-bit shingle x.
    rng = np.random.default_rng(config.seed)
    a = rng.integers(0, 2 ** 64, config.num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2 ** 64, config.num_perm, dtype=np.uint64, endpoint=False)
    return a[:, None], b[:, None]


_CACHE: dict[NearDuplicateConfig, tuple[np.ndarray, np.ndarray]] = {}


def minhash(hashes: Collection[int] | np.ndarray, config: NearDuplicateConfig
            ) -> np.ndarray | None:
    """The MinHash signature, (num_perm,) uint32, of a set of 32-bit shingle hashes (`shingles`
    or `shingle_hashes`); None for an empty set."""
    values = np.fromiter(hashes, np.uint64, len(hashes))
    if len(values) == 0:
        return None
    if config not in _CACHE:
        _CACHE[config] = _permutations(config)
    a, b = _CACHE[config]
    with np.errstate(over="ignore"):  # the wrap modulo 2^64 is the hash
        hashed = (a * values[None, :] + b) >> np.uint64(32)  # (num_perm, shingles)
    return hashed.min(axis=1).astype(np.uint32)


def signature(passages: Iterable[str], config: NearDuplicateConfig) -> np.ndarray | None:
    """The MinHash signature (num_perm uint32) of a document's passages; None without words."""
    return minhash(shingle_hashes(words(passages), config.shingle_size), config)


def band_keys(sig: np.ndarray, config: NearDuplicateConfig) -> list[str]:
    """One key per band, `"<band>:<hash of its rows>"`: equal keys, an equal band."""
    rows = config.rows
    return [f"{band}:{hashlib.blake2b(sig[band * rows:(band + 1) * rows].tobytes(), digest_size=8).hexdigest()}"
            for band in range(config.bands)]


def encode(sig: np.ndarray) -> str:
    """A signature as text (it crosses Beam's shuffles and the waves' scratch files)."""
    return base64.b64encode(sig.astype("<u4").tobytes()).decode("ascii")


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u4")


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """The share of equal entries of two signatures: the Jaccard estimate."""
    return float(np.mean(a == b))


def cluster_removals(members: Iterable[tuple[str, np.ndarray]], config: NearDuplicateConfig
                     ) -> list[tuple[str, str]]:
    """(removed doc_id, the doc_id it duplicates), by removed doc_id, within one band bucket:
    a document is removed when one with a smaller doc_id has an estimated Jaccard >=
    `threshold` with it; it names the smallest such one. The same whatever the input order."""
    ordered = sorted({doc_id: sig for doc_id, sig in members}.items())
    if len(ordered) < 2:
        return []
    ids = [doc_id for doc_id, _ in ordered]
    matrix = np.stack([sig for _, sig in ordered])  # (members, num_perm)
    removed = []
    for i in range(1, len(ids)):
        # the same figure as `estimated_jaccard`, against every smaller doc_id at once
        similar = np.flatnonzero(np.mean(matrix[:i] == matrix[i], axis=1) >= config.threshold)
        if similar.size:
            removed.append((ids[i], ids[similar[0]]))
    return removed


def resolve(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """removed doc_id -> the smallest doc_id it was found to duplicate (over all buckets)."""
    found: dict[str, str] = {}
    for removed, kept in pairs:
        if removed not in found or kept < found[removed]:
            found[removed] = kept
    return found


def band_records(row: dict, config: NearDuplicateConfig) -> list[tuple[str, tuple[str, str]]]:
    """A documents row's LSH band keys, each with (doc_id, its signature as text): the small
    records the band grouping shuffles; none for a row without words."""
    sig = signature(row["passages"], config)
    if sig is None:
        return []
    text = encode(sig)
    return [(key, (row["doc_id"], text)) for key in band_keys(sig, config)]


def bucket_pairs(members: Iterable[tuple[str, str]], config: NearDuplicateConfig
                 ) -> list[tuple[str, str]]:
    """A band bucket's (doc_id, signature text) members -> its `cluster_removals`."""
    return cluster_removals(((doc_id, decode(sig)) for doc_id, sig in members), config)
