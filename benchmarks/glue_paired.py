"""Paired diagnostics for issue 5: does one detail of our fine-tuning move GLUE scores?

Each seed runs OUR fine-tuning twice, identical but for one detail. Both runs draw the same
data order (its own generator) and the same new head (seeded before it is built), so the
per-seed difference is the effect of that detail plus, where it changes dropout draws, their
luck. The peer of bench_glue.py (transformers' Trainer) differs from us in these details only:

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

    .venv/bin/python benchmarks/glue_paired.py --vary stock_dropout --tasks mrpc --seeds 1,2
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time

import torch

from finetune import checkpoint, loop
from finetune.family import Prepared
from finetune.glue import FAMILY
from finetune.glue.tasks import parse_tasks
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


PAIRS = {
    "head_scale": (Variant("reference head"), Variant(f"{WIDER:.3f}x wider head",
                                                      head_scale=WIDER)),
    "stock_dropout": (Variant("fast paths"), Variant("stock ops", stock_dropout=True)),
    "head_draws": (Variant("truncated-normal head", head_draws="truncated"),
                   Variant("normal head", head_draws="normal")),
    "trainer_draws": (Variant("stock ops, our draws", stock_dropout=True),
                      Variant("stock ops, the Trainer's draws", stock_dropout=True,
                              trainer_draws=True)),
}


def redraw_head(weight: torch.Tensor, draws: str, seed: int, std: float) -> None:
    """`weight` from a generator of its own (the process's stream stays untouched)."""
    if draws == "normal":  # transformers' BertForSequenceClassification
        trainer_draws.head_(weight, seed, std)
    else:  # the reference run_classifier.py, as our model draws it
        truncated_normal_(weight, std, torch.Generator().manual_seed(seed))


def run(encoder: BertModel, prepared: Prepared, lr: float, seed: int,
        cfg: loop.FinetuneConfig, variant: Variant) -> float:
    """bench_glue.run_ours under `variant`: the dev score in points."""
    # torch's stock attention path takes whole padded rows (the Trainer's layout)
    family = dataclasses.replace(FAMILY, pack_sequences=not variant.stock_dropout)
    model = loop.build_model(family, encoder, prepared.task, seed)
    with torch.no_grad():  # a multiplication: no random number drawn, the pair stays paired
        model.classifier.weight.mul_(variant.head_scale)
    if variant.head_draws:
        redraw_head(model.classifier.weight, variant.head_draws, seed,
                    encoder.config.initializer_range)
    with stock_ops() if variant.stock_dropout else contextlib.nullcontext():
        if not variant.trainer_draws:
            loop.train(family, model, prepared.train, lr, seed, cfg)
        else:
            trainer_draws.head_(model.classifier.weight, seed, encoder.config.initializer_range)
            torch.manual_seed(seed)  # the Trainer's constructor seeds the process again
            loop.train(family, model, prepared.train, lr, seed, cfg,
                       epoch_batches=trainer_draws.epoch_batches(len(prepared.train),
                                                                 cfg.batch_size, seed))
        return 100 * loop.merge_scored(loop.evaluate(family, model, prepared, cfg))[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vary", choices=sorted(PAIRS), required=True)
    p.add_argument("--tasks", default="mrpc")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--max_train_examples", type=int, default=None, help="for a quick try")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--sides", choices=("both", "first", "second"), default="both",
                   help="run one side only (the other's scores known from an earlier run)")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from bench_glue import default_data_dir, default_model_dir  # this script's folder

    model_dir, data_dir = default_model_dir(), default_data_dir()
    encoder = checkpoint.load_encoder(model_dir)
    first, second = PAIRS[args.vary]
    for task in parse_tasks(args.tasks):
        cfg = loop.FinetuneConfig(learning_rates=(args.learning_rate,), progress=False,
                                  max_train_examples=args.max_train_examples)
        prepared = dataclasses.replace(FAMILY, predict_test=False).prepare(
            task.name, data_dir, checkpoint.load_tokenizer(model_dir), cfg.max_seq_length,
            cfg.max_train_examples, None, False)
        sides = {"both": (first, second), "first": (first,), "second": (second,)}[args.sides]
        for seed in (int(s) for s in args.seeds.split(",")):
            scores, seconds = [], []
            for variant in sides:
                start = time.perf_counter()
                scores.append(run(encoder, prepared, args.learning_rate, seed, cfg, variant))
                seconds.append(time.perf_counter() - start)
            line = ", ".join(f"{v.name} {score:.2f} ({secs:.0f} s)"
                             for v, score, secs in zip(sides, scores, seconds))
            diff = f", diff {scores[1] - scores[0]:+.2f}" if len(scores) == 2 else ""
            print(f"{task.name} seed {seed}: {line}{diff}", flush=True)


if __name__ == "__main__":
    main()
