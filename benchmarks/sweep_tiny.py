"""A benchmark-sized `bert-dag --sweep`: model size in the form of the paper's Table 6, at tiny
scale on CPU.

Runs flows/sweeps/model_size.yaml (bert_tiny vs bert_mini on the bundled sample's corpus, the
same shards for both) with enough steps to separate the two, then fine-tunes each on real GLUE
dev sets (SST-2, MRPC, RTE from ../shared/data/glue, training examples capped). Prints the
sweep's table, its report folder, the wall time and the load average. These are tiny-scale
numbers (two small models, ~1 MB of pre-training text, minutes of CPU): they show the
machinery, not the paper's results.

    nice -n 5 .venv/bin/python benchmarks/sweep_tiny.py [--output runs/sweep_tiny] \
        [--phase1_steps 100] [--glue /path/holding/glue]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))


def settings(args: argparse.Namespace) -> list[str]:
    """The `--set` flags shared by both variants: fp32 (no bf16 matrix units on many CPUs),
    the steps and batches given, fine-tuning capped for minutes, not hours."""
    half = args.batch_size // 2
    return [f"pretrain.{k}={v}" for k, v in (
        ("engine.precision", "fp32"), ("phase1.steps", args.phase1_steps),
        ("phase2.steps", args.phase2_steps), ("phase1.warmup_steps", max(1, args.phase1_steps // 10)),
        ("phase2.warmup_steps", max(1, args.phase2_steps // 10)),
        ("phase1.global_batch_size", args.batch_size), ("phase1.micro_batch_size", args.batch_size),
        ("phase2.global_batch_size", half), ("phase2.micro_batch_size", half))] + [
        f"finetune.data={args.glue}", "finetune.tasks=sst-2,mrpc,rte",
        f"finetune.learning_rates={args.finetune_lr}", "finetune.seeds=1",
        f"finetune.epochs={args.epochs}",
        f"finetune.max_train_examples={args.max_train_examples}",
        f"finetune.max_eval_examples={args.max_eval_examples}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=str(REPO / "flows" / "sweeps" / "model_size.yaml"))
    parser.add_argument("--output", default=str(REPO / "runs" / "sweep_tiny"))
    parser.add_argument("--glue", default=str(SHARED),
                        help="folder holding glue/ (default: ../shared/data)")
    parser.add_argument("--phase1_steps", type=int, default=100)
    parser.add_argument("--phase2_steps", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--finetune_lr", type=float, default=5e-4,
                        help="fine-tuning peak learning rate (small models take larger ones)")
    parser.add_argument("--max_train_examples", type=int, default=1000)
    parser.add_argument("--max_eval_examples", type=int, default=0)
    args = parser.parse_args(argv)
    for key, value in (("PREFECT_HOME", os.path.join(args.output, ".prefect")),
                       ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                       ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120"),
                       ("DS_ACCELERATOR", "cpu"), ("HF_HUB_OFFLINE", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
    from flows.cli import main as bert_dag

    started, load = time.monotonic(), os.getloadavg()
    flags = [flag for s in settings(args) for flag in ("--set", s)]
    code = bert_dag(["--sweep", args.sweep, "--output", args.output, *flags])
    print(f"wall {time.monotonic() - started:.0f} s; load average at start "
          f"{load[0]:.1f}, at end {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    return code


if __name__ == "__main__":
    sys.exit(main())
