"""Issue 42 item 6: the modern recipe's pieces at tiny scale on CPU, real DeepSpeed runs.

1. WSD (1-sqrt decay over the last 20% of steps) against linear warmup+decay, equal tokens:
   held-out MLM loss at the stable point (80% of steps) and at the end.
2. (not yet implemented in this version: decay on a second source; see the report)
3. 30% against 15% dynamic masking, equal steps; each export fine-tuned on SST-2.

    HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu .venv/bin/python benchmarks/modern_recipe.py \
        --data /tmp/recipe --out /tmp/modern_recipe --steps 100

`--data` is a `python -m flows.cli --preset tiny --data_only --output DIR
--set shards.phase1.next_sentence=false` folder (its shards128-* and vocab-*).
Tiny-scale CPU numbers say little about real scale.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclasses.dataclass(frozen=True)
class Args:
    data: str
    out: str
    steps: int
    preset: str
    lr: float
    batch: int
    parts: str
    finetune_epochs: int


def parse() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/tmp/recipe")
    p.add_argument("--out", default="/tmp/modern_recipe")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--parts", default="1,3")
    p.add_argument("--finetune_epochs", type=int, default=3)
    return Args(**vars(p.parse_args()))


def one(pattern: str) -> str:
    found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern}")
    return found[0]


def run(a: Args, name: str, *, optimizer: dict, data: dict | None = None,
        eval_every: int = 0) -> list[dict]:
    """One pre-training run; its validation records."""
    from common import settings
    from training import config as cfg
    from training import pretrain
    from training.config import PhaseConfig

    out = os.path.join(a.out, name)
    phase = PhaseConfig(name="phase1", train_shards=one(f"{a.data}/shards128-*"),
                        max_seq_length=128, micro_batch_size=a.batch, global_batch_size=a.batch,
                        steps=a.steps, warmup_steps=max(1, a.steps // 10),
                        learning_rate=a.lr,
                        decay_steps=optimizer.pop("decay_steps", 0))
    config = cfg.PretrainConfig(
        model=cfg.ModelConfig(preset=a.preset, dropout=0.0),
        data=cfg.PretrainDataConfig(vocab_dir=one(f"{a.data}/vocab-*"), num_workers=1,
                                    shuffle_buffer=64),
        cadence=cfg.CadenceConfig(log_every=10, eval_every=eval_every, eval_batches=10,
                                  checkpoint_every=0, export_hf=True),
        output_dir=out, phases=(phase,), seed=1)
    sections = {"optimizer": optimizer}
    if data:
        sections["data"] = data
    config = settings.apply(config, sections)
    t = time.time()
    print(f"[{name}] {a.steps} steps ...", flush=True)
    pretrain.run(config)
    print(f"[{name}] done in {time.time() - t:.0f}s", flush=True)
    return [r for r in pretrain.read_metrics(out) if r["split"] == "validation"]


def mlm(record: dict) -> float:
    return record.get("mlm_loss", record["loss"])


def part1(a: Args) -> None:
    every = a.steps // 5
    lin = run(a, "linear", optimizer={"schedule": "linear"}, eval_every=every)
    wsd = run(a, "wsd", optimizer={"schedule": "wsd", "decay_shape": "1-sqrt",
                                   "decay_steps": a.steps // 5}, eval_every=every)
    stable = a.steps - a.steps // 5
    print(f"\n| schedule | val MLM @ stable point (step {stable}) | val MLM @ end (step {a.steps}) |")
    print("|---|---|---|")
    for name, recs in (("linear", lin), ("wsd 20% 1-sqrt", wsd)):
        at = {r["step"]: mlm(r) for r in recs}
        print(f"| {name} | {at.get(stable, float('nan')):.3f} | {at.get(a.steps, float('nan')):.3f} |")


def part3(a: Args) -> None:
    rows = []
    for rate in (0.15, 0.30):
        name = f"mask{int(rate * 100)}"
        recs = run(a, name, optimizer={"schedule": "linear"},
                   data={"dynamic_masking": True, "dynamic_masked_lm_prob": rate})
        export = one(os.path.join(a.out, name, "*hf*"))
        ft = os.path.join(a.out, f"ft-{name}")
        cmd = [sys.executable, "-m", "finetune.cli", "--model", export,
               "--data", str(REPO / "data/sample"), "--tasks", "sst2", "--output", ft,
               "--learning_rates", "1e-4", "--epochs", str(a.finetune_epochs), "--seeds", "1",
               "--no_progress", "--no_test"]
        print("[finetune]", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        print(done.stdout[-2000:], done.stderr[-2000:], flush=True)
        score = re.findall(r"accuracy=([0-9.]+)", done.stderr + done.stdout)
        rows.append((rate, mlm(recs[-1]) if recs else float("nan"),
                     float(score[-1]) if score else float("nan")))
    labels = [line.split("\t")[-1] for line in
              (REPO / "data/sample/glue/SST-2/dev.tsv").read_text().splitlines()[1:] if line.strip()]
    majority = 100 * max(labels.count(x) for x in set(labels)) / len(labels)
    print("\n| masking | val MLM @ end | SST-2 dev accuracy | majority class |")
    print("|---|---|---|---|")
    for rate, loss, acc in rows:
        print(f"| {rate:.2f} | {loss:.3f} | {acc:.2f} | {majority:.2f} |")


def main() -> None:
    a = parse()
    os.makedirs(a.out, exist_ok=True)
    parts = {int(x) for x in a.parts.split(",")}
    if 1 in parts:
        part1(a)
    if 3 in parts:
        part3(a)


if __name__ == "__main__":
    main()
