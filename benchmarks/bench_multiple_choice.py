"""Multiple choice, ours vs `transformers`' Trainer + AutoModelForMultipleChoice, on Cosmos QA.

Data: Cosmos QA's validation file (the only Cosmos QA file here) split by passage with the
fixed rule of `finetune.multiple_choice.data.split_by_group` (every 5th passage to dev: 2,379
train / 606 dev questions), then fixed random subsets of --max_train_examples and
--max_eval_examples (the loop's `subset`, seed 0). Both sides get the same token ids (our
encoding, equal to the transformers tokenizer's:
tests/finetune/multiple_choice/test_multiple_choice_data.py).

First a parity check: a fresh head on MiniLM, exported, and AutoModelForMultipleChoice loading
it give the same per-choice scores (torch.testing.assert_close) on dev questions.

Then per seed, in one process: our loop (`finetune.loop.run_one`: build, train, evaluate) and
the Trainer (from the MiniLM folder, its own head draw), same recipe: batch 16 questions,
learning rate, epochs, AdamW weight decay 0.01 (none on biases/LayerNorm), epsilon 1e-6,
linear warmup 10% then decay, gradient clipping 1.0, max_seq_length 128, float32 on the CPU.
Timed: training and dev prediction (loading and tokenization are done before). Prints accuracy
per seed, the mean difference ours - peer with a 95% t interval, and the wall-time ratio.

    .venv/bin/python benchmarks/bench_multiple_choice.py --seeds 1,2,3 --threads 1
"""
from __future__ import annotations

import argparse
import logging
import os
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
from finetune.multiple_choice import FAMILY
from finetune.multiple_choice import data as mc_data
from finetune.multiple_choice import family as mc
from finetune.options import HEAD_INITS, FinetuneConfig, for_recipe


def default_valid_csv() -> str:
    return str(Path(__file__).resolve().parents[2] / "shared" / "data" / "multiple_choice"
               / "cosmosqa" / "valid.csv")


def check_parity(encoder, prepared, model_dir: str, workdir: str, count: int = 8) -> float:
    """Max |ours - peer| of per-choice scores on the first `count` dev questions (asserted
    close); the same weights in both models."""
    import transformers

    from model.hf import export_hf_folder

    torch.manual_seed(0)
    ours = FAMILY.build_head(encoder, prepared.task).eval()
    folder = os.path.join(workdir, "parity")
    export_hf_folder(ours, model_dir, folder)
    peer = transformers.AutoModelForMultipleChoice.from_pretrained(folder).eval()
    dev = prepared.dev["dev"]
    indices = list(range(count))
    padded = mc.pad_choices(dev, indices)
    shape = (count, dev.num_choices, -1)
    with torch.no_grad():
        expected = peer(input_ids=padded.input_ids.view(shape),
                        token_type_ids=padded.token_type_ids.view(shape),
                        attention_mask=(padded.sequence_ids >= 0).long().view(shape)).logits
        got = FAMILY.outputs(ours, FAMILY.make_batch(dev, indices, 128, train=False))["scores"]
    torch.testing.assert_close(got, expected)
    return float((got - expected).abs().max())


def run_ours(encoder, prepared, lr: float, seed: int, cfg: FinetuneConfig) -> Outcome:
    clock = Clock()
    result, _ = loop.run_one(FAMILY, encoder, prepared, lr, seed, cfg)
    return Outcome(result.metrics["accuracy"], *clock.lap())


class _Rows(torch.utils.data.Dataset):
    """Our encoded questions as the dicts DataCollatorForMultipleChoice expects."""

    def __init__(self, encoded: mc_data.EncodedChoices):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> dict:
        ids = self.encoded.input_ids[i]
        return {"input_ids": [x.tolist() for x in ids],
                "token_type_ids": [x.tolist() for x in self.encoded.token_type_ids[i]],
                "attention_mask": [[1] * len(x) for x in ids],
                "labels": int(self.encoded.labels[i])}


def run_peer(model_dir: str, prepared, lr: float, seed: int, cfg: FinetuneConfig,
             workdir: str) -> Outcome:
    import transformers
    from transformers import AutoModelForMultipleChoice, DataCollatorForMultipleChoice, Trainer

    transformers.set_seed(seed)
    model = AutoModelForMultipleChoice.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    trainer = Trainer(model=model, args=trainer_arguments(cfg, lr, seed, workdir),
                      train_dataset=_Rows(prepared.train),
                      data_collator=DataCollatorForMultipleChoice(tokenizer))
    clock = Clock()
    trainer.train()
    dev = prepared.dev["dev"]
    logits = trainer.predict(_Rows(dev)).predictions  # (N, C)
    return Outcome(mc.accuracy(dev.labels, logits), *clock.lap())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF BERT folder (default: shipped MiniLM)")
    p.add_argument("--valid_csv", default=default_valid_csv())
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--learning_rate", type=float, default=mc.RECIPE.learning_rates[0])
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max_train_examples", type=int, default=96)
    p.add_argument("--max_eval_examples", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--head_init", default="truncated_normal", choices=HEAD_INITS,
                   help="our new head's draw (normal: the Trainer's distribution)")
    add_device_flags(p)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or default_model_dir()
    seeds = [int(s) for s in args.seeds.split(",")]
    cfg = for_recipe(mc.RECIPE, epochs=args.epochs, learning_rates=(args.learning_rate,),
                          seeds=tuple(seeds), max_train_examples=args.max_train_examples,
                          max_eval_examples=args.max_eval_examples, bf16=args.bf16, progress=False,
                          device=args.device, head_init=args.head_init)
    print(f"model {model_dir}\ndata {args.valid_csv} (passage split: every 5th to dev)\n"
          f"lr {args.learning_rate:g} epochs {args.epochs:g} batch {cfg.batch_size} "
          f"max_seq_length {cfg.max_seq_length} seeds {seeds} threads {torch.get_num_threads()} "
          f"our head {args.head_init}", flush=True)
    encoder = load_encoder(model_dir)
    tokenizer = load_tokenizer(model_dir)
    with tempfile.TemporaryDirectory() as workdir:
        task_dir = os.path.join(workdir, "cosmosqa")
        os.makedirs(task_dir)
        counts = mc_data.split_by_group(args.valid_csv, "context", 5,
                                        os.path.join(task_dir, "train.csv"),
                                        os.path.join(task_dir, "valid.csv"))
        prepared = FAMILY.prepare("cosmosqa", task_dir, tokenizer, cfg.max_seq_length,
                                  cfg.max_train_examples, cfg.max_eval_examples, False)
        print(f"split {counts[0]} train / {counts[1]} dev questions; slice "
              f"{len(prepared.train)} train ({loop.num_training_steps(len(prepared.train), cfg)} "
              f"steps) / {len(prepared.dev['dev'])} dev", flush=True)
        diff = check_parity(encoder, prepared, model_dir, workdir)
        print(f"parity: per-choice scores equal AutoModelForMultipleChoice's "
              f"(assert_close; max |diff| {diff:.2e})", flush=True)
        rows = interleaved(
            seeds, lambda seed: run_ours(encoder, prepared, args.learning_rate, seed, cfg),
            lambda seed: run_peer(model_dir, prepared, args.learning_rate, seed, cfg, workdir),
            device=cfg.device)
    print_seed_table(rows, "accuracy")


if __name__ == "__main__":
    main()
