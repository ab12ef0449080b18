"""Paired diagnostics: does one detail of our fine-tuning move GLUE or NER scores?

Each seed runs OUR fine-tuning twice, identical but for one detail. Both runs draw the same
data order (its own generator) and the same new head (seeded before it is built), so the
per-seed difference is the effect of that detail plus, where it changes dropout draws, their
luck. The peer of bench_glue.py and bench_ner.py (transformers' Trainer) differs from us in
these details only (without dropout and in one data order the runs are equal step for step:
tests/finetune/glue/test_glue_trainer_parity.py, tests/finetune/ner/test_ner_trainer_parity.py):

  head_scale     the new head's initial spread. Ours starts as BERT's reference
                 `run_classifier.py`: N(0, 0.02) truncated at 2 std (std 0.0176);
                 BertForSequenceClassification's is untruncated, 1.137x wider. The second run
                 multiplies the same draws by that factor.
  head_draws     the new head drawn twice from one private generator seeded per run: the
                 reference's truncated normal against the peer's untruncated N(0, 0.02). The
                 process's generator is left as it was, so data order and dropout stay paired;
                 unlike head_scale these are the two distributions themselves.
  trainer_draws  our code with torch's stock ops twice: once with our own draws, once with the
                 Trainer's (bench_glue.run_peer's: head, data order and dropout stream, as
                 peers/trainer_draws.py replays them). The second run is the
                 Trainer's run computed by our code: its score should be the Trainer's at that
                 seed (bench_glue.py), if nothing else differs at full scale.
  stock_dropout  our CPU fast paths (integer dropout masks, our attention dropout, per-example
                 attention on packed rows) against torch's stock ops on padded batches
                 (F.dropout, SDPA's dropout, row masks): the configuration that equals the
                 Trainer draw for draw (tests/finetune/glue/test_glue_trainer_parity.py).
                 Same distribution, other random numbers, so a systematic difference would
                 show as a mean shift.
  data_order     our shuffle (one generator for every epoch) against the Trainer's (a
                 generator seeded with seed + epoch); our head and fast paths in both. Both are
                 uniform shuffles: a mean shift would be a bug.

Tasks are the registry's (`finetune.tasks`): GLUE's and NER's (the families whose head is a
`classifier` layer and whose batches can be packed or padded).

    .venv/bin/python benchmarks/paired_draws.py --vary stock_dropout --tasks mrpc --seeds 1,2
    .venv/bin/python benchmarks/paired_draws.py --vary head_draws --tasks conll2003 \
        --max_train_examples 800 --max_eval_examples 200 --epochs 4 --learning_rate 1e-4
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path

import torch

from finetune import checkpoint, loop
from finetune.family import Family, Prepared
from finetune.options import FinetuneConfig
from finetune.tasks import TaskEntry, parse_tasks
from model.bert import BertModel, truncated_normal_
from model.cpu_ops import stock_ops
from peers import trainer_draws

WIDER = 1 / math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(math.sqrt(2)))
"""std of N(0, 1) over std of N(0, 1) truncated at +-2: 1.137."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One side of a pair: how the encoder, the recipe and the new head are set."""

    name: str
    stock_dropout: bool = False
    head_scale: float = 1.0
    head_draws: str | None = None
    """Redraw the head's weights from a private generator: "truncated" or "normal"."""
    trainer_draws: bool = False
    """Head, data order and dropout stream drawn as transformers' Trainer draws them."""
    trainer_order: bool = False
    """Only the data order drawn as the Trainer draws it."""


PAIRS = {
    "head_scale": (Variant("reference head"), Variant(f"{WIDER:.3f}x wider head",
                                                      head_scale=WIDER)),
    "stock_dropout": (Variant("fast paths"), Variant("stock ops", stock_dropout=True)),
    "head_draws": (Variant("truncated-normal head", head_draws="truncated"),
                   Variant("normal head", head_draws="normal")),
    "trainer_draws": (Variant("stock ops, our draws", stock_dropout=True),
                      Variant("stock ops, the Trainer's draws", stock_dropout=True,
                              trainer_draws=True)),
    "data_order": (Variant("our data order"), Variant("the Trainer's data order",
                                                      trainer_order=True)),
}


def redraw_head(weight: torch.Tensor, draws: str, seed: int, std: float) -> None:
    """`weight` from a generator of its own (the process's stream stays untouched)."""
    if draws == "normal":  # transformers' BertForSequenceClassification
        trainer_draws.head_(weight, seed, std)
    else:  # the reference run_classifier.py, as our model draws it
        truncated_normal_(weight, std, torch.Generator().manual_seed(seed))


def run(family: Family, encoder: BertModel, prepared: Prepared, lr: float, seed: int,
        cfg: FinetuneConfig, variant: Variant) -> float:
    """bench_glue.run_ours (bench_ner.run_ours) under `variant`: the dev score in points."""
    # torch's stock attention path takes whole padded rows (the Trainer's layout)
    family = dataclasses.replace(family, pack_sequences=not variant.stock_dropout)
    model = loop.build_model(family, encoder, prepared.task, seed)
    with torch.no_grad():  # a multiplication: no random number drawn, the pair stays paired
        model.classifier.weight.mul_(variant.head_scale)
    if variant.head_draws:
        redraw_head(model.classifier.weight, variant.head_draws, seed,
                    encoder.config.initializer_range)
    with stock_ops() if variant.stock_dropout else contextlib.nullcontext():
        epoch_batches = None
        if variant.trainer_draws:
            trainer_draws.head_(model.classifier.weight, seed, encoder.config.initializer_range)
        if variant.trainer_draws or variant.trainer_order:
            torch.manual_seed(seed)  # the Trainer's constructor seeds the process again
            epoch_batches = trainer_draws.epoch_batches(len(prepared.train), cfg.batch_size,
                                                        seed)
        loop.train(family, model, prepared.train, lr, seed, cfg, epoch_batches=epoch_batches)
        return 100 * loop.merge_scored(loop.evaluate(family, model, prepared, cfg))[1]


def prepare(entry: TaskEntry, data_root: str, model_dir: str,
            cfg: FinetuneConfig) -> Prepared:
    """The task's train and dev units (GLUE without its test files)."""
    family = entry.family
    if hasattr(family, "predict_test"):
        family = dataclasses.replace(family, predict_test=False)
    return family.prepare(entry.task, os.path.join(data_root, entry.data_folder),
                          checkpoint.load_tokenizer(model_dir), cfg.max_seq_length,
                          cfg.max_train_examples, cfg.max_eval_examples, False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vary", choices=sorted(PAIRS), required=True)
    p.add_argument("--tasks", default="mrpc")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max_train_examples", type=int, default=None,
                   help="a fixed subset of the training examples (seed 0)")
    p.add_argument("--max_eval_examples", type=int, default=None,
                   help="a fixed subset of the dev examples (seed 0)")
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"),
                   help="folder with glue/ and conll2003/")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--sides", choices=("both", "first", "second"), default="both",
                   help="run one side only (the other's scores known from an earlier run)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from finetune_parity import default_model_dir, t_interval  # this script's folder

    model_dir = default_model_dir()
    encoder = checkpoint.load_encoder(model_dir)
    first, second = PAIRS[args.vary]
    sides = {"both": (first, second), "first": (first,), "second": (second,)}[args.sides]
    for entry in parse_tasks(args.tasks):
        if not hasattr(entry.family, "pack_sequences"):
            raise SystemExit(f"{entry.task}: the {entry.family.name} family has no packed/padded "
                             "switch; this diagnostic covers GLUE and NER")
        cfg = FinetuneConfig(learning_rates=(args.learning_rate,), epochs=args.epochs,
                                  progress=False, max_train_examples=args.max_train_examples,
                                  max_eval_examples=args.max_eval_examples)
        prepared = prepare(entry, args.data, model_dir, cfg)
        diffs = []
        for seed in (int(s) for s in args.seeds.split(",")):
            scores, seconds = [], []
            for variant in sides:
                start = time.perf_counter()
                scores.append(run(entry.family, encoder, prepared, args.learning_rate, seed,
                                  cfg, variant))
                seconds.append(time.perf_counter() - start)
            line = ", ".join(f"{v.name} {score:.2f} ({secs:.0f} s)"
                             for v, score, secs in zip(sides, scores, seconds))
            if len(scores) == 2:
                diffs.append(scores[1] - scores[0])
                line += f", diff {diffs[-1]:+.2f}"
            print(f"{entry.task} seed {seed}: {line}", flush=True)
        if len(diffs) >= 2:
            mean, low, high = t_interval(diffs)
            print(f"{entry.task}: {second.name} - {first.name} over {len(diffs)} seeds: "
                  f"{mean:+.2f} points, 95% t interval [{low:+.2f}, {high:+.2f}]",
                  flush=True)


if __name__ == "__main__":
    main()
