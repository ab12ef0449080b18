"""SQuAD v1.1 and v2.0 fine-tuning, ours (finetune.loop + the squad family) vs `transformers`'
Trainer + AutoModelForQuestionAnswering, on the shipped MiniLM checkpoint.

Data:
- v1.1 (`--task squad1`): no v1.1 training file is here, so the official dev set is split by
  article (no paragraph on both sides): training questions from `--train_articles`, evaluation
  questions from `--eval_articles`.
- v2.0 (`--task squad2`): train on `--train_file` (default the first 11 articles of the
  official train-v2.0, 5,147 questions, 348 unanswerable), score `--dev_file` (default the
  Normans and Rhine articles of dev-v2.0, 706 questions, 320 unanswerable); `--max_train` /
  `--max_eval` draw fixed subsets by question (seed 0).
Both sides train on the same windows (our `features.cut_windows`: max_seq_length, doc_stride
128, max_query_length 64, padded per batch to the longest window) with the same recipe (AdamW
lr, eps 1e-6, weight decay 0.01, linear warmup 10% then decay, clipping 1.0, batch, epochs,
seed); the Trainer's logits go through our post-processing (n-best 20, max answer length 30,
text through offsets; v2.0: the null threshold tau that maximises F1 on the evaluation
questions, chosen for each side on its own null odds), so what differs is the training: model
code, loop, data order and dropout draws. Each side's `predictions.json` is scored by the
OFFICIAL scorer (../shared/peers/squad/evaluate-v1.1.py or evaluate-v2.0.py, a subprocess) on
a JSON file of exactly the evaluation questions. Timed: training + prediction +
post-processing (the Trainer's includes loading its model, about 1 s). Prints EM/F1 per seed,
the mean F1 difference with a 95% t interval over seeds, and the wall-time ratio.

    .venv/bin/python benchmarks/bench_squad.py                        # v1.1, 3 seeds
    .venv/bin/python benchmarks/bench_squad.py --task squad2 --max_train 400 --max_eval 300

Targets: F1 within 1.0 point of the Trainer's; wall time at most 0.8x the Trainer's.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from finetune_parity import (
    Clock,
    Outcome,
    add_device_flags,
    default_model_dir,
    interleaved,
    print_seed_table,
    trainer_arguments,
)

from finetune import loop
from finetune.checkpoint import load_encoder, load_tokenizer
from finetune.options import HEAD_INITS, FinetuneConfig, resolve_device
from finetune.squad import FAMILY
from finetune.squad import data as squad_data
from finetune.squad.family import score_split

SHARED = Path(__file__).resolve().parents[2] / "shared"
SCORERS = {"squad1": "evaluate-v1.1.py", "squad2": "evaluate-v2.0.py"}


def official(scorer: Path, data_file: Path, predictions: str) -> dict:
    """The official scorer's JSON output on `predictions` (the predictions.json text)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(predictions)
    try:
        done = subprocess.run([sys.executable, str(scorer), str(data_file), f.name],
                              capture_output=True, text=True, check=True, timeout=300)
    finally:
        os.unlink(f.name)
    return json.loads(done.stdout)


def question_file(source: str, qids: set[str], out: Path) -> Path:
    """An official-layout JSON file of the questions `qids` of `source` (paragraphs and articles
    left without questions are dropped), for the official scorer."""
    dataset = json.loads(Path(source).read_text(encoding="utf-8"))
    articles = []
    for article in dataset["data"]:
        paragraphs = [{**p, "qas": [q for q in p["qas"] if q["id"] in qids]}
                      for p in article["paragraphs"]]
        paragraphs = [p for p in paragraphs if p["qas"]]
        if paragraphs:
            articles.append({**article, "paragraphs": paragraphs})
    out.write_text(json.dumps({**dataset, "data": articles}), encoding="utf-8")
    return out


def scored(prepared, version_2: bool, start_logits, end_logits, scorer: Path, gold: Path,
           clock: Clock) -> Outcome:
    """Our post-processing, then the official scorer, of one side's logits."""
    files = score_split(prepared.context.examples["dev"], prepared.dev["dev"], start_logits,
                        end_logits, version_2).files
    wall, cpu = clock.lap()
    result = official(scorer, gold, files["predictions.json"])
    f1 = result["f1"] / 100
    extra = {"EM": result["exact" if version_2 else "exact_match"] / 100}
    if version_2:
        extra.update({"HasAns F1": result.get("HasAns_f1", float("nan")) / 100,
                      "NoAns F1": result.get("NoAns_f1", float("nan")) / 100})
    return Outcome(f1, wall, cpu, extra)


def run_ours(encoder, prepared, cfg: FinetuneConfig, lr: float, seed: int,
             version_2: bool, scorer: Path, gold: Path) -> Outcome:
    clock = Clock()
    model = loop.build_model(FAMILY, encoder, prepared.task, seed, resolve_device(cfg.device),
                             cfg.head_init)
    loop.train(FAMILY, model, prepared.train, lr, seed, cfg, desc=f"ours seed {seed}")
    outputs = loop.predict(FAMILY, model, prepared.dev["dev"], cfg)
    return scored(prepared, version_2, outputs["start_logits"], outputs["end_logits"], scorer,
                  gold, clock)


def run_peer(model_dir: str, prepared, cfg: FinetuneConfig, lr: float, seed: int,
             workdir: str, version_2: bool, scorer: Path, gold: Path,
             masked_loss: bool = False) -> Outcome:
    import transformers
    from transformers import AutoModelForQuestionAnswering, DataCollatorWithPadding, Trainer

    from peers.trainer_runs import MaskedSpanLoss, SquadWindows

    clock = Clock()
    transformers.set_seed(seed)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    trainer_class = MaskedSpanLoss if masked_loss else Trainer
    trainer = trainer_class(model=model, args=trainer_arguments(cfg, lr, seed, workdir),
                            train_dataset=SquadWindows(prepared.train, True),
                            data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    start_logits, end_logits = trainer.predict(SquadWindows(prepared.dev["dev"], False)).predictions
    return scored(prepared, version_2, start_logits, end_logits, scorer, gold, clock)


def read_splits(args) -> tuple[squad_data.SquadSplit, squad_data.SquadSplit, str]:
    """(training split, evaluation split, the file the evaluation questions come from)."""
    if args.task == "squad1":
        train_articles = [int(a) for a in args.train_articles.split(",")]
        eval_articles = [int(a) for a in args.eval_articles.split(",")]
        split = squad_data.read_squad(args.data, training=True, version_2=False)
        train = squad_data.SquadSplit(args.data, split.version, examples=[
            e for e in split.examples if e.article in train_articles])
        dev_all = squad_data.read_squad(args.data, training=False, version_2=False)
        dev = squad_data.SquadSplit(args.data, dev_all.version, examples=[
            e for e in dev_all.examples if e.article in eval_articles])
        return train, dev, args.data
    train = squad_data.read_squad(args.train_file, training=True, version_2=True)
    dev = squad_data.read_squad(args.dev_file, training=False, version_2=True)
    return (squad_data.subset(train, args.max_train), squad_data.subset(dev, args.max_eval),
            args.dev_file)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF BERT folder (default: shipped MiniLM)")
    p.add_argument("--task", default="squad1", choices=sorted(SCORERS))
    p.add_argument("--data", default=str(SHARED / "data" / "squad" / "dev-v1.1.json"),
                   help="squad1: the file split by article")
    p.add_argument("--train_articles", default="2,8,13", help="squad1: article indices to train on")
    p.add_argument("--eval_articles", default="19,29", help="squad1: article indices to score")
    p.add_argument("--train_file",
                   default=str(SHARED / "data" / "squad" / "train-v2.0-first11.json"))
    p.add_argument("--dev_file",
                   default=str(SHARED / "data" / "squad" / "dev-v2.0-normans-rhine.json"))
    p.add_argument("--max_train", type=int, default=None, help="squad2: training questions")
    p.add_argument("--max_eval", type=int, default=None, help="squad2: evaluation questions")
    p.add_argument("--scorers", default=str(SHARED / "peers" / "squad"),
                   help="folder of the official evaluate-v1.1.py and evaluate-v2.0.py")
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--head_init", default="truncated_normal", choices=HEAD_INITS,
                   help="our new head's draw (normal: the Trainer's distribution)")
    p.add_argument("--no_progress", action="store_true")
    p.add_argument("--peer_loss", default="stock", choices=("stock", "masked"),
                   help="the Trainer's span loss: stock (softmax over its batch's padding too) "
                        "or masked (over each window's own tokens, as ours)")
    p.add_argument("--only", choices=("ours", "trainer"), default=None,
                   help="one side's runs alone (each side's runs are deterministic per seed: "
                        "a paired change of one side reuses the other's)")
    add_device_flags(p)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    seeds = [int(s) for s in args.seeds.split(",")]
    version_2 = args.task == "squad2"
    scorer = Path(args.scorers) / SCORERS[args.task]
    train, dev, dev_source = read_splits(args)
    prepared = FAMILY.prepare_splits(args.task, train, dev, load_tokenizer(model_dir),
                                     args.max_seq_length)
    cfg = FinetuneConfig(max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                              epochs=args.epochs, learning_rates=(args.learning_rate,),
                              seeds=tuple(seeds), bf16=args.bf16, progress=not args.no_progress,
                              device=args.device, eval_batch_size=64, head_init=args.head_init)
    impossible = sum(e.is_impossible for e in train.examples)
    print(f"model {model_dir}\n{args.task}: train {len(train)} questions ({impossible} "
          f"unanswerable), {len(prepared.train)} windows, "
          f"{loop.num_training_steps(len(prepared.train), cfg)} steps; eval {len(dev)} "
          f"questions ({sum(e.is_impossible for e in dev.examples)} unanswerable), "
          f"{len(prepared.dev['dev'])} windows\nmax_seq_length {args.max_seq_length} doc_stride "
          f"128 max_query_length 64 batch {args.batch_size} epochs {args.epochs:g} lr "
          f"{args.learning_rate:g} seeds {seeds} threads {torch.get_num_threads()} our head "
          f"{args.head_init}", flush=True)
    encoder = load_encoder(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        gold = question_file(dev_source, {e.qid for e in dev.examples}, Path(tmp) / "eval.json")
        if args.only:
            for seed in seeds:
                one = (run_ours(encoder, prepared, cfg, args.learning_rate, seed, version_2,
                                scorer, gold) if args.only == "ours" else
                       run_peer(model_dir, prepared, cfg, args.learning_rate, seed, tmp,
                                version_2, scorer, gold, args.peer_loss == "masked"))
                extra = " ".join(f"{k} {100 * v:.2f}" for k, v in one.extra.items())
                print(f"seed {seed}: {args.only} F1 {100 * one.score:.2f} {extra} in "
                      f"{one.seconds:.1f}s (CPU {one.cpu_seconds:.1f}s)", flush=True)
            return
        rows = interleaved(
            seeds,
            lambda seed: run_ours(encoder, prepared, cfg, args.learning_rate, seed, version_2,
                                  scorer, gold),
            lambda seed: run_peer(model_dir, prepared, cfg, args.learning_rate, seed, tmp,
                                  version_2, scorer, gold, args.peer_loss == "masked"),
            device=cfg.device)
    print_seed_table(rows, "F1")


if __name__ == "__main__":
    main()
