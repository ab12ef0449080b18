"""bert_tiny against modernbert_tiny at equal tokens on the same MLM-only shards: held-out MLM
loss and accuracy after the same steps, batch, learning rate and seed (dropout 0), then one
probe: SST-2 (the bundled sample) fine-tuned from each export with one small recipe, beside
the majority-class baseline. Real DeepSpeed runs on this machine's CPU.

    .venv/bin/bert-dag --preset modernbert_tiny --data_only --output /tmp/mbt   # the shards
    .venv/bin/python benchmarks/compare_encoders.py --shards /tmp/mbt/shards128-* \\
        --vocab /tmp/mbt/vocab-* --steps 300

Tiny models on a few hundred thousand tokens of CPU training say little about real scale:
the numbers are reported as they come out.
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    shards: str
    """MLM-only shard folder (train and validation shards, its manifest)."""
    vocab: str
    """The shards' vocabulary folder."""
    output: str = "/tmp/compare_encoders"
    """Where the runs and probes go."""
    steps: int = 300
    """Optimizer steps of each run (32 rows of the shards' length each)."""
    learning_rate: float = 1e-3
    """Peak learning rate (10% warmup, linear decay)."""


def pretrain(cfg: CompareConfig, preset: str) -> dict:
    from training import config as training
    from training import pretrain as run

    out = Path(cfg.output) / preset
    manifest = json.loads((Path(cfg.shards) / "manifest.json").read_text())
    phase = training.PhaseConfig(name="phase1", train_shards=cfg.shards,
                                 max_seq_length=int(manifest["max_seq_length"]),
                                 micro_batch_size=32, global_batch_size=32, steps=cfg.steps,
                                 warmup_steps=cfg.steps // 10, learning_rate=cfg.learning_rate)
    config = training.PretrainConfig(
        model=training.ModelConfig(preset=preset, dropout=0.0),
        objective=training.ObjectiveConfig(name="mlm", next_sentence=False),
        data=training.PretrainDataConfig(vocab_dir=cfg.vocab, num_workers=1),
        cadence=training.CadenceConfig(log_every=50, eval_every=cfg.steps // 3, eval_batches=10,
                                       checkpoint_every=cfg.steps, keep_checkpoints=1),
        output_dir=str(out), phases=(phase,), seed=7)
    started = time.perf_counter()
    run.run(config)
    seconds = time.perf_counter() - started
    records = run.read_metrics(str(out))
    valid = [r for r in records if r["split"] == "validation"]
    tokens = cfg.steps * 32 * phase.max_seq_length
    return {"preset": preset, "validation": [(r["step"], r["mlm_loss"], r["mlm_accuracy"])
                                             for r in valid],
            "seconds": seconds, "tokens": tokens, "export": str(out / "hf")}


def probe(cfg: CompareConfig, export: str, name: str) -> float:
    out = Path(cfg.output) / f"probe-{name}"
    subprocess.run([sys.executable, "-m", "finetune.cli", "--model", export, "--data",
                    str(REPO / "data" / "sample"), "--tasks", "sst-2", "--output", str(out),
                    "--learning_rates", "1e-4", "--epochs", "3", "--seeds", "1",
                    "--batch_size", "32", "--no_progress"], check=True, cwd=REPO)
    return 100 * json.loads((out / "results.json").read_text())["tasks"][0]["score"]


def majority_baseline() -> float:
    with open(REPO / "data" / "sample" / "glue" / "SST-2" / "dev.tsv", encoding="utf-8") as f:
        labels = [row["label"] for row in csv.DictReader(f, delimiter="\t")]
    return 100 * collections.Counter(labels).most_common(1)[0][1] / len(labels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = CompareConfig("", "")
    parser.add_argument("--shards", required=True, help="MLM-only shard folder")
    parser.add_argument("--vocab", required=True, help="the shards' vocabulary folder")
    parser.add_argument("--output", default=defaults.output)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--learning_rate", type=float, default=defaults.learning_rate)
    cfg = CompareConfig(**vars(parser.parse_args(argv)))
    rows = []
    for preset in ("bert_tiny", "modernbert_tiny"):
        print(f"pre-training {preset}: {cfg.steps} steps", flush=True)
        result = pretrain(cfg, preset)
        result["sst2"] = probe(cfg, result["export"], preset)
        rows.append(result)
    baseline = majority_baseline()
    print(f"\n| encoder | tokens | seconds | tokens/s | held-out MLM loss (step: loss) | "
          f"held-out MLM accuracy (last) | SST-2 dev accuracy (majority {baseline:.2f}) |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        curve = ", ".join(f"{s}: {loss:.3f}" for s, loss, _ in r["validation"])
        print(f"| {r['preset']} | {r['tokens']:,} | {r['seconds']:.0f} | "
              f"{r['tokens'] / r['seconds']:,.0f} | {curve} | {r['validation'][-1][2]:.4f} | "
              f"{r['sst2']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
