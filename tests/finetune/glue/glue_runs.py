"""Preparing a GLUE task and building the optimizer and schedule, shared by the GLUE fine-tuning
tests."""

from __future__ import annotations

from finetune import loop
from finetune.glue.family import FAMILY
from finetune.options import FinetuneConfig
from training.optim import LinearWarmupDecay


def _prepare(task: str, data_dir: str, tokenizer, cfg: FinetuneConfig, family=FAMILY):
    return family.prepare(task, data_dir, tokenizer, cfg.max_seq_length, cfg.max_train_examples,
                          cfg.max_eval_examples, cfg.skip_bad_rows)


def _optimizer_and_schedule(model, cfg: FinetuneConfig):
    optimizer = loop.build_optimizer(model, cfg.learning_rates[0], cfg)
    return optimizer, LinearWarmupDecay(optimizer, cfg.learning_rates[0], 1, 10)
