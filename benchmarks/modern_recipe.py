"""Issue 42 item 6: the modern recipe's pieces at tiny scale on CPU, real DeepSpeed runs.

1. WSD (1-sqrt decay over the last 20% of steps) against linear warmup+decay, equal tokens:
   held-out MLM loss at the stable point (80% of steps) and at the end.
2. A decay on a second source against no decay: a stable WSD run (`decay_steps` 0) on
   Wikipedia, then from its last checkpoint's export four runs of 20% more steps: at the peak
   (no decay) or decaying (1-sqrt to 0), each on Wikipedia or on books; each run's held-out
   books MLM loss at its end (books none of them trained on), and the stable run's there.
3. 30% against 15% dynamic masking, equal steps; each export fine-tuned on SST-2.

    HF_HUB_OFFLINE=1 DS_ACCELERATOR=cpu .venv/bin/python benchmarks/modern_recipe.py \
        --data /tmp/recipe --out /tmp/modern_recipe --steps 100

`--data` is a `python -m flows.cli --preset tiny --data_only --output DIR
--set shards.phase1.next_sentence=false` folder (its shards128-* and vocab-*). Part 2 makes
its own shards of `--wiki` and `--books` (the flow's stages, in `<out>/data`, reused by a
re-run) with that vocabulary, as a decay on other sources tokenizes with the run's.
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
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
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
    wiki: str
    books: str


def parse() -> Args:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/tmp/recipe")
    p.add_argument("--out", default="/tmp/modern_recipe")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--preset", default="bert_tiny")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--parts", default="1,2,3")
    p.add_argument("--finetune_epochs", type=int, default=3)
    p.add_argument("--wiki", default=str(SHARED / "wiki"),
                   help="part 2's stable source: MediaWiki dump(s)")
    # [a-z]: the folder's README.nltk-gutenberg.txt is no book
    p.add_argument("--books", default=str(SHARED / "books" / "[a-z]*.txt"),
                   help="part 2's second source: book text files")
    return Args(**vars(p.parse_args()))


def one(pattern: str) -> str:
    found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern}")
    return found[0]


def run(a: Args, name: str, *, optimizer: dict, data: dict | None = None,
        eval_every: int = 0, phase: dict | None = None, init_from: str = "",
        eval_batches: int = 10) -> list[dict]:
    """One pre-training run (`phase`: the phase's settings over the defaults); its validation
    records."""
    from common import settings
    from training import config as cfg
    from training import pretrain
    from training.config import PhaseConfig

    out = os.path.join(a.out, name)
    phase = PhaseConfig(**{
        "name": "phase1", "train_shards": one(f"{a.data}/shards128-*"), "max_seq_length": 128,
        "micro_batch_size": a.batch, "global_batch_size": a.batch, "steps": a.steps,
        "warmup_steps": max(1, a.steps // 10), "learning_rate": a.lr,
        "decay_steps": optimizer.pop("decay_steps", 0), **(phase or {})})
    model = cfg.ModelConfig(preset="", init_from=init_from, dropout=0.0) if init_from \
        else cfg.ModelConfig(preset=a.preset, dropout=0.0)
    config = cfg.PretrainConfig(
        model=model, optimizer=settings.apply(cfg.OptimizerConfig(), optimizer),
        data=cfg.PretrainDataConfig(vocab_dir=one(f"{a.data}/vocab-*"), num_workers=1,
                                    shuffle_buffer=64),
        cadence=cfg.CadenceConfig(log_every=10, eval_every=eval_every, eval_batches=eval_batches,
                                  checkpoint_every=0, export_hf=True),
        output_dir=out, phases=(phase,), seed=1)
    if data:
        config = settings.apply(config, {"data": data})
    t = time.time()
    print(f"[{name}] {phase.steps} steps ...", flush=True)
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


def source_shards(a: Args, source: str, path: str) -> str:
    """Shards of one source alone (128 tokens, no NSP, a fifth of its documents held out),
    tokenized with `--data`'s vocabulary: the flow's extract, corpus and shards stages in
    `<out>/data`."""
    from flows import config as flow_config
    from flows import steps
    from flows.stages import StageResult
    from pipelines.shards import config as shards_config

    tiny = flow_config.tiny()
    shards = dataclasses.replace(tiny.shards, phase1=dataclasses.replace(
        shards_config.tiny(1), next_sentence=False))
    cfg = dataclasses.replace(tiny, output=os.path.join(a.out, "data"), shards=shards,
                              data=flow_config.DataConfig(**{"wikipedia": "", "books": "",
                                                             source: path}))
    vocab = one(f"{a.data}/vocab-*")
    documents = getattr(steps, f"extract_{source}")(cfg)
    corpus = steps.build_corpus(cfg, [documents])
    made = steps.make_shards(cfg, corpus, StageResult("vocab", vocab, "", True, 0.0), 1)
    print(f"[data] {source}: {made.path}", flush=True)
    return made.path


def part2(a: Args) -> None:
    wiki, books = source_shards(a, "wikipedia", a.wiki), source_shards(a, "books", a.books)
    held_out = {"validation_shards": books}  # books: their held-out documents
    decay = a.steps // 5
    stable = run(a, "stable-wiki", optimizer={"schedule": "wsd"}, eval_every=a.steps,
                 eval_batches=25, phase={"train_shards": wiki, **held_out})
    start = os.path.join(a.out, "stable-wiki", "hf")
    rows = [("stable run (wiki), its end", 0, stable)]
    for shards, source in ((wiki, "wiki"), (books, "books")):
        for decay_steps, arm in ((0, "no decay"), (decay, "decay 1-sqrt")):
            name = f"{'decay' if decay_steps else 'peak'}-{source}"
            recs = run(a, name, optimizer={"schedule": "wsd", "decay_steps": decay_steps},
                       eval_every=decay, init_from=start, eval_batches=25,
                       phase={"train_shards": shards, "steps": decay, "warmup_steps": 0,
                              **held_out})
            rows.append((f"{arm} on {source}", decay, recs))
    print(f"\n| from the stable run (step {a.steps}) | more steps | held-out books MLM loss |")
    print("|---|---:|---:|")
    for name, steps, recs in rows:
        print(f"| {name} | {steps} | {mlm(recs[-1]) if recs else float('nan'):.3f} |")


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
    if 2 in parts:
        part2(a)
    if 3 in parts:
        part3(a)


if __name__ == "__main__":
    main()
