"""Near-duplicate removal (pipelines/corpus/near_duplicates.py) against exact Jaccard by brute
force over all pairs, on real text with planted near-duplicates.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_near_duplicates.py [--documents 3000]
        [--per_cell 150] [--no-beam] [--out benchmarks/near_duplicates]
        [--num_perm 128 --bands 16 --threshold 0.8 ...: any NearDuplicateConfig setting]

Documents: consecutive 200-word windows of the shared Gutenberg books (../shared/data/books,
else the bundled sample; `BERT_SHARED_DATA` points elsewhere). Planted: `--per_cell` copies of
randomly chosen windows for each of 6 cells: 2%, 5% or 10% of the words edited, either
scattered over the text or in one run of consecutive words; each edit a substitution, an
insertion or a deletion at random (seeded).

Truth: the exact Jaccard similarity of every pair of documents over the same 5-word shingle
sets (`near_duplicates.shingles`), all pairs at once as a sparse product (intersections =
X X^T, X the documents x shingles 0/1 matrix), checked against Python set arithmetic on every
pair at J >= 0.5 and 5,000 random pairs. Ours: the pure functions on the same documents, a bucket
per band key as Beam's GroupByKey makes them (`band_records`, `bucket_pairs`, `resolve`), and
(unless `--no-beam`) `NearDuplicatePairs` itself on Beam's local runner, whose pairs must equal
those.

Recall at J >= t: of the pairs with exact Jaccard >= t, the share that ours puts in one cluster
(following `duplicate_of` from each document to a document not removed reaches the same one for
both). Precision: of the documents ours removes, the share whose exact Jaccard with the
document it names is >= `threshold` (0.8); "within 0.05": >= threshold - 0.05 (the estimate's
standard error at 0.8 with 128 permutations is 0.035). Targets (the issue): recall >= 0.95 at
J >= 0.9, precision >= 0.99. Writes results.json to --out.

Measured (3,000 windows + 900 planted, defaults: 5-word shingles, 128 permutations, 16 bands
of 8, threshold 0.8; one core, 2026-11-28; 19 s in all):
- recall 1.0 at J >= 0.9 (152 pairs, all planted: no two book windows are near-duplicates);
  0.909 at J >= 0.8 (485 pairs).
- precision 0.918 (434 of the 473 removed have exact J >= 0.8 with the one they name), 1.0
  within 0.05: every one of the 39 below 0.8 is a "10% in one run" copy, a cell whose exact J
  sits at 0.788 on average, right at the threshold, where an unbiased estimate with standard
  error 0.035 confirms a good share of the pairs just below it. The strict target (0.99) is not
  met on this set; no setting meets it here: 256 permutations in 32 bands give 0.928, 512 in 64
  give 0.957 (recall at 0.8: 0.949, 0.977). With `--layouts scattered` (only scattered edits,
  exact J 0.83 / 0.65 / 0.44 at 2 / 5 / 10%): precision 1.0 (119 removed), but no pair at
  J >= 0.9 to measure recall on, which is why the run layout is planted as well.
- Per cell (copies, mean exact J, removed): 2% scattered 150, 0.833, 119; 2% run 150, 0.925,
  150; 5% scattered 150, 0.645, 0; 5% run 150, 0.871, 150; 10% scattered 150, 0.437, 0; 10% run
  150, 0.788, 54.
- seconds: ours (pure functions) 1.7, `NearDuplicatePairs` on the local runner 12.8 (the same
  pairs), exact Jaccard of all 7.6 M pairs 2.2 (sparse product).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import sparse

from common import settings, storage
from pipelines.corpus import near_duplicates as near
from pipelines.corpus.near_duplicates import NearDuplicateConfig

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
SHARES = (0.02, 0.05, 0.10)
LAYOUTS = ("scattered", "run")


def windows(count: int, size: int = 200) -> list[str]:
    """The first `count` consecutive `size`-word windows of the books, book by book."""
    folder = SHARED / "books" if (SHARED / "books").is_dir() else REPO / "data" / "sample" / "books"
    out = []
    for path in sorted(folder.glob("*.txt")):
        if not path.name.startswith("README"):
            words = path.read_bytes().decode("utf-8", "replace").split()
            out += [" ".join(words[i:i + size]) for i in range(0, len(words) - size + 1, size)]
    return out[:count]


def edited(text: str, share: float, layout: str, rng: random.Random) -> str:
    """`text` with round(share * words) edits (substitute, insert or delete), scattered or in
    one run of consecutive positions."""
    words = text.split()
    k = max(1, round(share * len(words)))
    if layout == "run":
        start = rng.randrange(len(words) - k + 1)
        positions = list(range(start, start + k))
    else:
        positions = sorted(rng.sample(range(len(words)), k))
    for i in reversed(positions):  # from the end: earlier positions stay valid
        new = f"zzxq{rng.randrange(10 ** 6)}"
        op = rng.choice(("substitute", "insert", "delete"))
        if op == "substitute":
            words[i] = new
        elif op == "insert":
            words.insert(i, new)
        else:
            del words[i]
    return " ".join(words)


def corpus(documents: int, per_cell: int, layouts: tuple[str, ...] = LAYOUTS
           ) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """({doc_id: text}, {planted doc_id: (its original's doc_id, its cell)})."""
    rng = random.Random(0)
    base = windows(documents)
    texts = {f"doc-{i:05d}": t for i, t in enumerate(base)}
    planted = {}
    for share in SHARES:
        for layout in layouts:
            cell = f"{share:.0%} {layout}"
            for _ in range(per_cell):
                original = rng.randrange(len(base))
                doc_id = f"near-{len(planted):05d}"
                texts[doc_id] = edited(base[original], share, layout, rng)
                planted[doc_id] = (f"doc-{original:05d}", cell)
    return texts, planted


def exact_jaccard(shingles: list[set[int]]) -> np.ndarray:
    """(documents, documents) exact Jaccard of every pair (upper triangle; 0 elsewhere)."""
    vocabulary: dict[int, int] = {}
    rows, cols = [], []
    for i, items in enumerate(shingles):
        for s in items:
            rows.append(i)
            cols.append(vocabulary.setdefault(s, len(vocabulary)))
    x = sparse.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                          shape=(len(shingles), len(vocabulary)))
    inter = (x @ x.T).toarray()  # (documents, documents) shared shingles
    sizes = np.array([len(s) for s in shingles], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        jaccard = inter / (sizes[:, None] + sizes[None, :] - inter)
    return np.triu(np.nan_to_num(jaccard), k=1)


def check_exact(jaccard: np.ndarray, shingles: list[set[int]]) -> int:
    """Python set arithmetic on every pair at J >= 0.5 and 5,000 random pairs agrees with the
    sparse product; the number of pairs checked."""
    rng = np.random.default_rng(0)
    n = len(shingles)
    pairs = list(zip(*np.nonzero(jaccard >= 0.5)))
    pairs += [(i, j) for i, j in rng.integers(0, n, (5000, 2)) if i < j]
    for i, j in pairs:
        a, b = shingles[i], shingles[j]
        if abs(len(a & b) / len(a | b) - jaccard[i, j]) > 1e-6:
            raise AssertionError(f"pair {i},{j}: sets {len(a & b) / len(a | b)}, "
                                 f"product {jaccard[i, j]}")
    return len(pairs)


def ours(texts: dict[str, str], config: NearDuplicateConfig) -> dict[str, str]:
    """The pure functions as Beam runs them: a bucket per band key."""
    buckets = defaultdict(list)
    for doc_id, text in texts.items():
        row = {"doc_id": doc_id, "passages": [text]}
        for key, member in near.band_records(row, config):
            buckets[key].append(member)
    return near.resolve(pair for members in buckets.values() if len(members) > 1
                        for pair in near.bucket_pairs(members, config))


def ours_on_beam(texts: dict[str, str], config: NearDuplicateConfig) -> dict[str, str]:
    """`NearDuplicatePairs` on Beam's local runner (lines written to a temporary folder)."""
    import apache_beam as beam

    from pipelines.corpus.remove_near_duplicates import NearDuplicatePairs

    rows = [{"doc_id": d, "source": "bench", "source_file": "", "title": "", "passages": [t]}
            for d, t in texts.items()]
    with tempfile.TemporaryDirectory() as folder:
        with beam.Pipeline() as pipeline:
            _ = (pipeline | beam.Create(rows) | NearDuplicatePairs(config)
                 | beam.MapTuple(lambda removed, kept: f"{removed}\t{kept}")
                 | beam.io.WriteToText(os.path.join(folder, "pairs")))
        lines = [line for path in sorted(Path(folder).glob("pairs*"))
                 for line in path.read_text().splitlines()]
    return dict(line.split("\t") for line in lines)


def root(doc_id: str, removed: dict[str, str]) -> str:
    while doc_id in removed:
        doc_id = removed[doc_id]
    return doc_id


def measure(texts, planted, jaccard, removed, config) -> dict:
    """Recall at 0.9 and at the threshold, precision, and each planted cell's recall."""
    ids = list(texts)
    index = {d: i for i, d in enumerate(ids)}

    def similarity(a: str, b: str) -> float:
        i, j = sorted((index[a], index[b]))
        return float(jaccard[i, j])

    def recall(at: float) -> tuple[int, float]:
        pairs = list(zip(*np.nonzero(jaccard >= at)))
        found = sum(root(ids[i], removed) == root(ids[j], removed) for i, j in pairs)
        return len(pairs), found / len(pairs) if pairs else 1.0

    judged = [similarity(r, k) for r, k in removed.items()]
    n90, recall90 = recall(0.9)
    n_t, recall_t = recall(config.threshold)
    cells = defaultdict(list)
    for doc_id, (original, cell) in planted.items():
        cells[cell].append((similarity(doc_id, original),
                            root(doc_id, removed) == root(original, removed),
                            similarity(doc_id, removed[doc_id]) if doc_id in removed else None))
    return {
        "pairs_at_0.9": n90, "recall_at_0.9": round(recall90, 4),
        "pairs_at_threshold": n_t, "recall_at_threshold": round(recall_t, 4),
        "removed": len(removed),
        "precision": round(sum(j >= config.threshold for j in judged) / max(1, len(judged)), 4),
        "precision_within_0.05": round(sum(j >= config.threshold - 0.05 for j in judged)
                                       / max(1, len(judged)), 4),
        "planted": {cell: _cell(v, config.threshold) for cell, v in cells.items()}}


def _cell(copies: list[tuple[float, bool, float | None]], threshold: float) -> dict:
    """A planted cell: copies, their mean exact Jaccard with the original, how many are at or
    above the threshold, how many ours removes, and how many of those name a document below it."""
    return {"copies": len(copies),
            "mean_exact_jaccard": round(float(np.mean([j for j, _, _ in copies])), 3),
            "at_threshold": sum(j >= threshold for j, _, _ in copies),
            "removed": sum(found for _, found, _ in copies),
            "removed_below_threshold": sum(named is not None and named < threshold
                                           for _, _, named in copies)}


def table(result: dict) -> str:
    head = [(f"{result['documents']} documents ({result['planted_copies']} planted); "
             f"config {result['config']}"),
            (f"recall at J >= 0.9:       {result['recall_at_0.9']:.4f} "
             f"({result['pairs_at_0.9']} pairs)"),
            (f"recall at J >= threshold: {result['recall_at_threshold']:.4f} "
             f"({result['pairs_at_threshold']} pairs)"),
            (f"precision:                {result['precision']:.4f} ({result['removed']} removed; "
             f"within 0.05: {result['precision_within_0.05']:.4f})"),
            (f"seconds: ours {result['seconds_ours']}, Beam local runner "
             f"{result.get('seconds_beam', '-')}, exact all pairs {result['seconds_exact']}"),
            "",
            (f"{'planted cell':<16}{'copies':>7}{'mean J':>8}{'J>=thr':>8}{'removed':>9}"
             f"{'of them J<thr':>15}")]
    rows = [(f"{cell:<16}{row['copies']:>7}{row['mean_exact_jaccard']:>8.3f}"
             f"{row['at_threshold']:>8}{row['removed']:>9}{row['removed_below_threshold']:>15}")
            for cell, row in result["planted"].items()]
    return "\n".join(head + rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--per_cell", type=int, default=150)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="edit layouts to plant, of: scattered,run")
    parser.add_argument("--no-beam", dest="beam", action="store_false")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "near_duplicates"))
    settings.add_config_flags(parser, NearDuplicateConfig)
    args = parser.parse_args(argv)
    config = settings.config_from_flags(NearDuplicateConfig(), args)
    texts, planted = corpus(args.documents, args.per_cell, tuple(args.layouts.split(",")))
    started = time.perf_counter()
    shingles = [near.shingles(t, config.shingle_size) for t in texts.values()]
    jaccard = exact_jaccard(shingles)
    seconds_exact = time.perf_counter() - started
    checked = check_exact(jaccard, shingles)
    started = time.perf_counter()
    removed = ours(texts, config)
    seconds_ours = time.perf_counter() - started
    result = {"documents": len(texts), "planted_copies": len(planted),
              "config": dataclasses.asdict(config),
              **measure(texts, planted, jaccard, removed, config),
              "exact_pairs_checked_with_sets": checked,
              "seconds_ours": round(seconds_ours, 2), "seconds_exact": round(seconds_exact, 2)}
    if args.beam:
        started = time.perf_counter()
        on_beam = ours_on_beam(texts, config)
        result["seconds_beam"] = round(time.perf_counter() - started, 2)
        if on_beam != removed:
            raise AssertionError(f"NearDuplicatePairs on Beam differs from the pure functions: "
                                 f"{len(on_beam.items() ^ removed.items())} pairs")
    print(table(result))
    storage.atomic_write_json(os.path.join(args.out, "results.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
