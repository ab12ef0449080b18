"""Sentence segmentation: speed and error counts of ours (blingfire + repairs) vs the peers.

    .venv/bin/python benchmarks/bench_sentences.py [--repeats 3] [--books DIR] [--squad FILE]

All segmenters run in this one process on the same passages: the shared books (extracted with
pipelines.books.cleaning, one passage per paragraph) and SQuAD v1.1 dev contexts (real Wikipedia
paragraphs). Falls back to the bundled sample books when ../shared/data is absent.

Speed is sentences/s (each segmenter's own sentence count over its best time) and MB/s of text.
Errors are counted with patterns that do not depend on any segmenter:
- split_after_title: a sentence ends in "Mr." / "Mrs." / "Dr." ... (a break before a name),
- starts_lower: a sentence after the first starts with a lower-case letter (a false break),
- missed: inside one sentence, a lower-case word, end punctuation, a space, a capitalised word
  (a break that was missed; a few are abbreviations, the same for every segmenter).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TITLE_AT_END = re.compile(r"(?:^|[\s\"'(])(?:Mr|Mrs|Ms|Dr|St|Messrs|Prof|Capt|Col|Gen|Rev)\.$")
STARTS_LOWER = re.compile(r"^[\"'\u2018\u201c(\[_]*[a-z]")
MISSED = re.compile(r"\b(?!(?:etc|viz|vs|cf|al|ca|no|pp|ed|vol|co|inc|ltd)\.)[a-z]{2,}[.!?]"
                    r"[\"\u201d')\]]* +[\"\u201c'(]*[A-Z][a-z]+")


def book_passages(folder: Path) -> list[str]:
    from pipelines.books import cleaning

    passages: list[str] = []
    for path in sorted(folder.glob("*.txt")):
        if path.name.startswith("README"):
            continue
        passages += cleaning.extract_book(path.read_bytes()).passages
    return passages


def wiki_passages(squad: Path) -> list[str]:
    if not squad.exists():
        return []
    data = json.loads(squad.read_text(encoding="utf-8"))
    return [" ".join(p["context"].split()) for a in data["data"] for p in a["paragraphs"]]


def segmenters() -> dict:
    """Ours and the peers that are installed (nupunkt and sentencex are in the `dev` extra)."""
    import blingfire

    from pipelines.corpus.sentences import split_sentences

    segs = {
        "ours (blingfire+repairs)": split_sentences,
        "blingfire": lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s],
    }
    try:
        import nupunkt
        punkt = nupunkt.load_default_model()
        segs["nupunkt"] = lambda t: [s.strip() for s in punkt.tokenize(t) if s.strip()]
    except ImportError:
        print("nupunkt not installed: skipped (pip install nupunkt==0.8.0)")
    try:
        import sentencex
        segs["sentencex"] = lambda t: [s.strip() for s in sentencex.segment("en", t) if s.strip()]
    except ImportError:
        print("sentencex not installed: skipped (pip install sentencex==1.0.32)")
    return segs


def measure(segment, passages: list[str], repeats: int) -> tuple[float, list[list[str]]]:
    segment(passages[0])  # load the model outside the timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = [segment(p) for p in passages]
        best = min(best, time.perf_counter() - start)
    return best, out


def errors(out: list[list[str]]) -> dict[str, int]:
    return {
        "split_after_title": sum(bool(TITLE_AT_END.search(s)) for ss in out for s in ss[:-1]),
        "starts_lower": sum(bool(STARTS_LOWER.match(s)) for ss in out for s in ss[1:]),
        "missed": sum(len(MISSED.findall(s)) for ss in out for s in ss),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--books", type=Path, default=SHARED / "books")
    parser.add_argument("--squad", type=Path, default=SHARED / "squad" / "dev-v1.1.json")
    args = parser.parse_args()
    books_dir = args.books if args.books.is_dir() else REPO / "data" / "sample" / "books"
    corpora = {"books": book_passages(books_dir), "wikipedia": wiki_passages(args.squad)}
    segs = segmenters()
    for name, passages in corpora.items():
        if not passages:
            continue
        mb = sum(len(p.encode("utf-8")) for p in passages) / 1e6
        print(f"\n{name}: {len(passages)} passages, {mb:.1f} MB ({books_dir if name == 'books' else args.squad})")
        print(f"{'segmenter':26} {'sentences':>9} {'sent/s':>9} {'MB/s':>6} {'ours/peer':>9}"
              f" {'split_after_title':>17} {'starts_lower':>12} {'missed':>6}")
        ours_rate = None
        for seg_name, segment in segs.items():
            seconds, out = measure(segment, passages, args.repeats)
            n = sum(map(len, out))
            rate = n / seconds
            ours_rate = ours_rate or rate
            e = errors(out)
            print(f"{seg_name:26} {n:9d} {rate:9.0f} {mb / seconds:6.2f} {ours_rate / rate:8.2f}x"
                  f" {e['split_after_title']:17d} {e['starts_lower']:12d} {e['missed']:6d}")


if __name__ == "__main__":
    main()
