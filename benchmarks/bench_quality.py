"""Quality filters: MB/s of `pipelines.corpus.quality.check` on one core, language ID on.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_quality.py [--books DIR] [--repeats 3]

The shared Gutenberg books (pipelines.books.cleaning.extract_book, one passage per paragraph) as documents
of three sizes: one paragraph each, about 10 KB of paragraphs each, and the whole book. Each runs
with the Gopher defaults + `languages=("en",)`, and with every rule forced to run (min_words 0,
so no short document leaves before the language model). Falls back to the bundled sample book
when ../shared/data is absent. MB is 10^6 bytes of UTF-8 passage text; the best of `--repeats`.
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from pipelines.books import cleaning
from pipelines.corpus import quality
from pipelines.corpus.quality import QualityConfig

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "books"


def books(folder: Path) -> list[list[str]]:
    """Each book's passages."""
    return [list(cleaning.extract_book(path.read_bytes()).passages)
            for path in sorted(folder.glob("*.txt")) if not path.name.startswith("README")]


def chunks(passages: list[str], size: int) -> list[list[str]]:
    """Runs of consecutive passages of about `size` characters."""
    out, current, length = [], [], 0
    for passage in passages:
        current.append(passage)
        length += len(passage)
        if length >= size:
            out.append(current)
            current, length = [], 0
    return out + ([current] if current else [])


def measure(documents: list[list[str]], config: QualityConfig, repeats: int) -> dict:
    size = sum(len(p.encode("utf-8")) for doc in documents for p in doc)
    best, rules = float("inf"), collections.Counter()
    for _ in range(repeats):
        start = time.perf_counter()
        drops = [quality.check(doc, config) for doc in documents]
        best = min(best, time.perf_counter() - start)
    rules.update(d.rule if d else "kept" for d in drops)
    return {"documents": len(documents), "MB": round(size / 1e6, 2),
            "MB_per_s": round(size / 1e6 / best, 3), "outcomes": dict(rules.most_common())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", type=Path, default=SHARED if SHARED.exists()
                        else REPO / "data" / "sample" / "books")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    passages = books(args.books)
    quality.known_languages()  # the model's load (~2 s) is once per process: not timed
    shapes = {"paragraph": [[p] for book in passages for p in book],
              "10KB": [c for book in passages for c in chunks(book, 10_000)],
              "book": passages}
    configs = {"defaults+en": QualityConfig(languages=("en",)),
               "every rule+en": QualityConfig(languages=("en",), min_words=0)}
    for shape, documents in shapes.items():
        for name, config in configs.items():
            print(json.dumps({"documents_as": shape, "config": name,
                              **measure(documents, config, args.repeats)}))


if __name__ == "__main__":
    main()
