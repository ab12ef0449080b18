"""Issue 5's MRPC question from every seed run so far: is our fine-tuning lower than the
Trainer's, or were its draws luckier? Reads benchmarks/mrpc_seeds.csv (one row per seed, copied
from the runs that RESULTS.md section 7 reports), prints the paired statistics and plots the
per-seed differences.

Two kinds of rows:
- `bench_glue`: our fine-tuning vs transformers' Trainer (bench_glue.py), each with its own
  code and its own random draws;
- `glue_paired_trainer_draws`: our code twice (paired_draws.py --vary trainer_draws --sides both),
  once with our draws and once replaying the Trainer's. The second equals the Trainer's own run
  at that seed (RESULTS 7i), so the pair isolates the draw schemes, with every line of code
  shared.

    .venv/bin/python benchmarks/mrpc_seeds.py [--plot benchmarks/mrpc_seeds.png]
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

from scipy import stats

HERE = Path(__file__).resolve().parent
RUNS = {"bench_glue": "ours vs the Trainer (bench_glue)",
        "glue_paired_trainer_draws": "our code, our draws vs the Trainer's (paired_draws)"}


def read_seeds(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return [{**row, "seed": int(row["seed"]), "ours": float(row["ours"]),
                 "trainer": float(row["trainer"])} for row in csv.DictReader(f)]


def paired_summary(rows: list[dict]) -> dict:
    """Trainer - ours per seed: mean, 95% t-interval, paired t and Wilcoxon p."""
    diffs = [r["trainer"] - r["ours"] for r in rows]
    n, mean = len(diffs), statistics.mean(diffs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return {"n": n, "ours": statistics.mean(r["ours"] for r in rows),
            "trainer": statistics.mean(r["trainer"] for r in rows), "diff": mean,
            "low": mean - half, "high": mean + half,
            "t_p": stats.ttest_1samp(diffs, 0.0).pvalue, "wilcoxon_p": stats.wilcoxon(diffs).pvalue,
            "trainer_higher": sum(d > 0 for d in diffs)}


def describe(name: str, s: dict) -> str:
    return (f"{name}: {s['n']} seeds, ours {s['ours']:.2f}, Trainer {s['trainer']:.2f}, "
            f"Trainer - ours {s['diff']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}], "
            f"paired t p {s['t_p']:.3f}, Wilcoxon p {s['wilcoxon_p']:.3f}, "
            f"Trainer higher on {s['trainer_higher']} of {s['n']}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for (run, label), marker in zip(RUNS.items(), "os"):
        mine = [r for r in rows if r["run"] == run]
        points = ax.scatter([r["seed"] for r in mine], [r["trainer"] - r["ours"] for r in mine],
                            marker=marker, label=label)
        if len(mine) > 1:
            s, color = paired_summary(mine), points.get_facecolor()[0]
            seeds = [r["seed"] for r in mine]
            ax.hlines(s["diff"], min(seeds), max(seeds), linestyles="--", color=color)
            ax.fill_between([min(seeds), max(seeds)], s["low"], s["high"], alpha=0.15,
                            color=color)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set(xlabel="seed", ylabel="MRPC dev score: Trainer - ours",
           title="MRPC per seed (dashed: mean, band: 95% interval)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=Path, default=HERE / "mrpc_seeds.csv")
    parser.add_argument("--plot", type=Path, default=None, help="write the per-seed plot here")
    args = parser.parse_args(argv)
    rows = read_seeds(args.seeds)
    for run, name in RUNS.items():
        mine = [r for r in rows if r["run"] == run]
        if len(mine) > 1:
            print(describe(name, paired_summary(mine)))
    print(describe("every seed, both kinds", paired_summary(rows)))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
