"""What preparing BERT's own corpus would take: English Wikipedia plus a books corpus, through
every data stage, on one machine and on Dataflow, from the rates measured here.

    .venv/bin/python benchmarks/forecast_data_prep.py [--dataflow_workers 32]
        [--local_memory benchmarks/local_memory/results.json]

The size assumed is the paper's (section 3.1): English Wikipedia 2,500M words and BooksCorpus
800M words, at the bytes per word and per WordPiece token measured on the shared Wikipedia and
books samples (`BYTES_PER_WORD`, `BYTES_PER_TOKEN`, in training/forecast.py, whose
`bert-pretrain --plan` forecasts the training from them): ~18.5 GB of text, ~4.4B tokens.

Rates (input text MB per second per worker process, Beam's local runner):
  - build_corpus and make_shards (128 and 512, dupe_factor 10): benchmarks/bench_local_memory.py
    (its results.json, one worker, in waves, the largest scale: 64x replicated Wikipedia),
    whose 1x holds `TEXT_BYTES_1X` bytes of text (the per-sentence copy marks aside), the
    waves' start-up included;
  - extract_wikipedia (from .bz2), extract_books and train_vocab: RESULTS.md sections 1, 10, 5.
Scaling: the local runner moves every shuffled byte through one runner process; with 2
workers make_shards ran 1.22x faster than with 1 (RESULTS.md 6.0, its profile bounds the
speed-up at 1.52x on any number of cores), so one machine is forecast at `LOCAL_SPEEDUP` x
one worker whatever its cores. Dataflow
is forecast at one worker's rate per vCPU, linear in vCPUs, plus `DATAFLOW_STARTUP_S` per
job: never measured here (no cloud account), an assumption stated as such.
Peak memory: the largest peak PSS of each stage's processes in the benchmark (one worker),
which waves keep from growing with the corpus. The benchmark ran on a shared 2-core machine
under load (other jobs beside it): a quiet core is up to 2x faster (RESULTS.md 6.0: make_shards
at 128 tokens, 0.48 MB of text/s), so the hours are an upper bound.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from training.forecast import BYTES_PER_TOKEN, BYTES_PER_WORD, TEXT_PER_BZ2_BYTE

WIKI_WORDS, BOOK_WORDS = 2_500e6, 800e6
TEXT_BYTES_1X = 4 * 553_640  # bench_local_memory.py's 1x: 4 copies of the minidump's text
MEASURED = {  # MB of the stage's input text per second, one worker (see the docstring)
    "extract_wikipedia": 8.33 / 3.68 * TEXT_PER_BZ2_BYTE,  # 8.33 MB/s of XML from .bz2 (RESULTS 1)
    "extract_books": 89.3 / 58.3,  # 16x books in 58.3 s (RESULTS 10)
    "train_vocab": 5.45 / 4.19,  # the Beam job on the shared books (RESULTS 5)
}
LOCAL_SPEEDUP = 1.22
DATAFLOW_VCPUS_PER_WORKER = 4
DATAFLOW_STARTUP_S = 300
STAGES = ("extract_wikipedia", "extract_books", "build_corpus", "train_vocab",
          "make_shards_128", "make_shards_512")


def benchmark_rates(path: Path) -> tuple[dict[str, float], dict[str, int]]:
    """From bench_local_memory's results: text MB/s per worker and peak RSS per stage, at
    the largest scale measured in waves with one worker."""
    rows = [r for r in json.loads(path.read_text())["results"] if r.get("variant") == "waves"]
    rates, peaks = {}, {}
    for stage in {r["stage"] for r in rows}:
        top = max((r for r in rows if r["stage"] == stage), key=lambda r: r["scale"])
        rates[stage] = top["scale"] * TEXT_BYTES_1X / 1e6 / top["seconds"]
        peaks[stage] = max(r.get("peak_pss_bytes", r["peak_rss_bytes"]) for r in rows
                           if r["stage"] == stage)
    return rates, peaks


def stage_inputs() -> dict[str, float]:
    """MB of text each stage reads, for the paper's corpus."""
    wiki, books = WIKI_WORDS * BYTES_PER_WORD / 1e6, BOOK_WORDS * BYTES_PER_WORD / 1e6
    return {"extract_wikipedia": wiki, "extract_books": books, "build_corpus": wiki + books,
            "train_vocab": wiki + books, "make_shards_128": wiki + books,
            "make_shards_512": wiki + books}


def forecast(rates: dict[str, float], peaks: dict[str, int], dataflow_workers: int) -> list[dict]:
    sizes = stage_inputs()
    vcpus = dataflow_workers * DATAFLOW_VCPUS_PER_WORKER
    return [{"stage": s, "input_gb": sizes[s] / 1e3, "rate": rates[s],
             "local_hours": sizes[s] / (rates[s] * LOCAL_SPEEDUP) / 3600,
             "dataflow_hours": (sizes[s] / (rates[s] * vcpus) + DATAFLOW_STARTUP_S) / 3600,
             "peak_gb": peaks.get(s, 0) / 1e9} for s in STAGES]


def table(rows: list[dict], dataflow_workers: int) -> str:
    lines = [(f"| stage | input text GB | MB/s per worker | one machine, hours | Dataflow, "
              f"{dataflow_workers} x {DATAFLOW_VCPUS_PER_WORKER} vCPU, hours | peak PSS GB "
              "(1 worker) |"), "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        peak = f"{r['peak_gb']:.2f}" if r["peak_gb"] else "-"
        lines.append(f"| {r['stage']} | {r['input_gb']:.1f} | {r['rate']:.2f} | "
                     f"{r['local_hours']:.1f} | {r['dataflow_hours']:.2f} | {peak} |")
    lines.append(f"| **all** | | | **{sum(r['local_hours'] for r in rows):.0f}** | "
                 f"**{sum(r['dataflow_hours'] for r in rows):.1f}** | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataflow_workers", type=int, default=32)
    parser.add_argument("--local_memory", default=str(REPO / "benchmarks" / "local_memory"
                                                      / "results.json"))
    args = parser.parse_args(argv)
    measured, peaks = benchmark_rates(Path(args.local_memory))
    rows = forecast({**MEASURED, **measured}, peaks, args.dataflow_workers)
    tokens = sum(stage_inputs()[s] for s in ("extract_wikipedia", "extract_books")) * 1e6 \
        / BYTES_PER_TOKEN
    print(f"corpus: {WIKI_WORDS / 1e6:,.0f}M + {BOOK_WORDS / 1e6:,.0f}M words, "
          f"{stage_inputs()['build_corpus'] / 1e3:.1f} GB of text, {tokens / 1e9:.1f}B tokens")
    print(table(rows, args.dataflow_workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
