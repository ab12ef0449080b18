"""NER fine-tuning, ours (the one loop + finetune.ner) vs `transformers`' Trainer with
AutoModelForTokenClassification, on the same MiniLM checkpoint, data slice and recipe.

Both train on the same units (our encoding: the first sub-token of each word labelled, the
rest -100, exactly transformers' run_ner alignment: tests/finetune/ner/test_ner_finetune.py) with the same
hyper-parameters (batch 32, AdamW lr / eps 1e-6 / weight decay 0.01, linear warmup 10% then
decay, clipping 1.0, max_seq_length 128) and seed; both are scored by the same seqeval entity
F1 (`FAMILY.score`). Timed: training + dev prediction (the Trainer's includes loading its
model, ours copies an encoder already in memory). Prints F1 per seed, the mean
difference with a 95% t interval over seeds, and the wall-time ratio.

    .venv/bin/python benchmarks/bench_ner.py --max_train 400 --max_dev 200 --seeds 1,2,3

`--head_init normal` starts our head from the Trainer's distribution (untruncated N(0, 0.02));
the default is BERT's reference (truncated, 1.137x narrower), which learns more slowly on short
runs (RESULTS.md section 13, 8d).

Targets: F1 within 1.0 point of the Trainer's; our wall time <= 0.8x its. Recorded in
benchmarks/RESULTS.md ("NER").
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile

import numpy as np
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

from finetune import checkpoint, loop
from finetune.family import Prepared
from finetune.ner import FAMILY
from finetune.ner.tasks import NER_TASKS
from finetune.options import HEAD_INITS, FinetuneConfig, resolve_device


class _Rows(torch.utils.data.Dataset):
    """Our units as the dicts DataCollatorForTokenClassification pads."""

    def __init__(self, encoded):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> dict:
        ids = self.encoded.input_ids[i]
        labels = np.full(len(ids), -100, np.int64)
        labels[self.encoded.word_positions[i]] = self.encoded.word_labels[i]
        return {"input_ids": ids.tolist(), "token_type_ids": [0] * len(ids),
                "attention_mask": [1] * len(ids), "labels": labels.tolist()}


def run_ours(encoder, prepared: Prepared, lr: float, seed: int,
             cfg: FinetuneConfig) -> Outcome:
    clock = Clock()
    model = loop.build_model(FAMILY, encoder, prepared.task, seed, resolve_device(cfg.device),
                             cfg.head_init)
    loop.train(FAMILY, model, prepared.train, lr, seed, cfg, desc="ours")
    scored = loop.evaluate(FAMILY, model, prepared, cfg)["dev"]
    return Outcome(scored.score, *clock.lap())


def run_peer(model_dir: str, prepared: Prepared, lr: float, seed: int,
             cfg: FinetuneConfig, workdir: str) -> Outcome:
    import transformers
    from transformers import (
        AutoModelForTokenClassification,
        DataCollatorForTokenClassification,
        Trainer,
    )

    clock = Clock()
    labels = NER_TASKS[prepared.task].labels
    transformers.set_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    trainer = Trainer(model=model, args=trainer_arguments(cfg, lr, seed, workdir),
                      train_dataset=_Rows(prepared.train),
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    trainer.train()
    dev = prepared.dev["dev"]
    logits = trainer.predict(_Rows(dev)).predictions  # (N, T_max, C), padded
    words = np.zeros((len(dev), cfg.max_seq_length, len(labels)), np.float32)  # (N, W, C)
    for u in range(len(dev)):
        n = len(dev.word_labels[u])
        words[u, :n] = logits[u, dev.word_positions[u]]
    scored = FAMILY.score(prepared, "dev", {"logits": words})
    return Outcome(scored.score, *clock.lap())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF BERT folder (default: shipped MiniLM)")
    p.add_argument("--data", default="../shared/data")
    p.add_argument("--task", default="conll2003", choices=sorted(NER_TASKS))
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max_train", type=int, default=400)
    p.add_argument("--max_dev", type=int, default=200)
    p.add_argument("--head_init", default="truncated_normal", choices=HEAD_INITS,
                   help="our new head's initial weights (normal: the Trainer's distribution)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on the loaded shared machine 2 ran far slower)")
    add_device_flags(p)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    seeds = [int(s) for s in args.seeds.split(",")]
    cfg = FinetuneConfig(epochs=args.epochs, learning_rates=(args.learning_rate,),
                              seeds=tuple(seeds), progress=False, bf16=args.bf16, device=args.device,
                              head_init=args.head_init)
    encoder = checkpoint.load_encoder(model_dir)
    prepared = FAMILY.prepare(args.task, os.path.join(args.data, NER_TASKS[args.task].folder),
                              checkpoint.load_tokenizer(model_dir), cfg.max_seq_length,
                              args.max_train, args.max_dev, False)
    print(f"{args.task}: {len(prepared.train)} train / {len(prepared.dev['dev'])} dev units, "
          f"{loop.num_training_steps(len(prepared.train), cfg)} steps, "
          f"lr {args.learning_rate:g}, {args.epochs:g} epochs, batch {cfg.batch_size}, "
          f"threads {torch.get_num_threads()}, our head {args.head_init}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        rows = interleaved(
            seeds, lambda seed: run_ours(encoder, prepared, args.learning_rate, seed, cfg),
            lambda seed: run_peer(model_dir, prepared, args.learning_rate, seed, cfg, workdir),
            device=cfg.device)
    print_seed_table(rows, "F1")


if __name__ == "__main__":
    main()
