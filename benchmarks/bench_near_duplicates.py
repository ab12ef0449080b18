"""Near-duplicate removal (pipelines/corpus/near_duplicates.py) against exact Jaccard by brute
force, on real text with planted near-duplicates.

    .venv/bin/python benchmarks/bench_near_duplicates.py [--documents 3000] [--planted 600]
        [--out benchmarks/near_duplicates]

Documents: consecutive 150-word windows of the shared Gutenberg books (shared/data/books, else
the bundled sample). Planted: copies of randomly chosen documents with 0.5%, 1%, 2%, 5% or 10% of
their words replaced (an equal share each, seeded). Truth: the exact Jaccard similarity of every
pair of documents that share a shingle (an inverted index over the same 5-word shingles; a pair
sharing none has similarity 0). Ours: the same functions build_corpus runs in Beam
(`signature`, `band_keys`, a bucket per band key as the GroupByKey makes them,
`cluster_removals`, `resolve`).

Recall at J >= 0.9 (the issue's target 0.95): the share of pairs with exact Jaccard >= 0.9 of
which ours removes the larger doc_id. Recall at J >= threshold likewise. Precision (target
0.99): the share of the documents ours removes whose exact Jaccard with the document they name
is >= threshold; within 0.05 of it beside (the MinHash estimate's standard error at 0.8 with 128
permutations is 0.035). Writes results.json.

Measured (3,000 windows + 600 planted, one core, 2026-11-28): recall 1.0 at J >= 0.9 (132
pairs), 0.90 at J >= 0.8 (370 pairs), precision 1.0 (323 removed); 1.7 s for ours, 2.9 s for
the exact index.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
EDITS = (0.005, 0.01, 0.02, 0.05, 0.10)


def windows(count: int, size: int = 150) -> list[str]:
    folder = SHARED / "books" if (SHARED / "books").is_dir() else REPO / "data" / "sample" / "books"
    out = []
    for path in sorted(folder.glob("*.txt")):
        if path.name.startswith("README"):
            continue
        words = path.read_bytes().decode("utf-8", "replace").split()
        out += [" ".join(words[i:i + size]) for i in range(0, len(words) - size, size)]
    return out[:count]


def edited(text: str, share: float, rng: random.Random) -> str:
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(share * len(words)))):
        words[i] = "zzxq" + str(rng.randrange(10 ** 6))
    return " ".join(words)


def exact_pairs(shingles: dict[str, set]) -> dict[tuple[str, str], float]:
    """Exact Jaccard of every pair sharing a shingle."""
    index = defaultdict(list)
    for doc_id, items in shingles.items():
        for s in items:
            index[s].append(doc_id)
    pairs = set()
    for ids in index.values():
        if len(ids) < 200:  # a shingle in hundreds of windows is a stock phrase, not a copy
            pairs.update(combinations(sorted(ids), 2))
    return {(a, b): len(shingles[a] & shingles[b]) / len(shingles[a] | shingles[b])
            for a, b in pairs}


def ours(texts: dict[str, str], config) -> dict[str, str]:
    from pipelines.corpus import near_duplicates as near

    buckets = defaultdict(list)
    for doc_id, text in texts.items():
        sig = near.signature([text], config)
        for key in near.band_keys(sig, config):
            buckets[key].append((doc_id, sig))
    pairs = [p for members in buckets.values() if len(members) > 1
             for p in near.cluster_removals(members, config)]
    return near.resolve(pairs)


def main(argv: list[str] | None = None) -> int:
    from pipelines.corpus import near_duplicates as near

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--planted", type=int, default=600)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "near_duplicates"))
    args = parser.parse_args(argv)
    config = near.NearDuplicateConfig()
    rng = random.Random(0)
    base = windows(args.documents)
    texts = {f"doc-{i:05d}": t for i, t in enumerate(base)}
    for j in range(args.planted):
        share = EDITS[j % len(EDITS)]
        texts[f"near-{j:05d}"] = edited(base[rng.randrange(len(base))], share, rng)
    started = time.perf_counter()
    shingles = {d: set(near.shingle_hashes(near.words([t]), config.shingle_size).tolist())
                for d, t in texts.items()}
    exact = exact_pairs(shingles)
    brute_s = time.perf_counter() - started
    started = time.perf_counter()
    removed = ours(texts, config)
    ours_s = time.perf_counter() - started

    def recall(at: float) -> tuple[int, float]:
        want = [pair for pair, j in exact.items() if j >= at]
        found = sum(max(pair) in removed for pair in want)
        return len(want), found / len(want) if want else 1.0

    def similarity(a: str, b: str) -> float:
        return exact.get((min(a, b), max(a, b)), 0.0)

    judged = [similarity(r, k) for r, k in removed.items()]
    n90, recall90 = recall(0.9)
    n80, recall80 = recall(config.threshold)
    result = {
        "documents": len(texts), "planted": args.planted, "edits": EDITS,
        "config": {"shingle_size": config.shingle_size, "num_perm": config.num_perm,
                   "bands": config.bands, "threshold": config.threshold},
        "pairs_at_0.9": n90, "recall_at_0.9": round(recall90, 4),
        "pairs_at_threshold": n80, "recall_at_threshold": round(recall80, 4),
        "removed": len(removed),
        "precision": round(sum(j >= config.threshold for j in judged) / max(1, len(judged)),
                           4),
        "precision_within_0.05": round(sum(j >= config.threshold - 0.05 for j in judged)
                                       / max(1, len(judged)), 4),
        "seconds_ours": round(ours_s, 2), "seconds_exact": round(brute_s, 2)}
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
