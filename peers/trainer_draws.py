"""The random draws of transformers' Trainer fine-tuning BertForSequenceClassification, as
benchmarks/bench_glue.py runs it (`set_seed(seed)`, `data_seed=seed`), for our `finetune.train`
to replay: with torch's stock dropout ops the replayed run is the Trainer's run, loss for loss
(tests/finetune/glue/test_glue_trainer_parity.py), so its score differs from ours only through the
draws.

What the Trainer draws (transformers 5.x, accelerate 1.x):
- the new head: N(0, initializer_range) from the process's generator, first thing after
  `set_seed` (the checkpoint's weights are loaded, not drawn);
- the process's generator is seeded again when the Trainer is built; every epoch its DataLoader
  then draws a base seed from it (one int64) before the first batch, and the dropout masks
  follow in that stream;
- the data order: Accelerate's seedable sampler shuffles epoch e with a generator seeded with
  data_seed + e (so its epoch 0 is our own epoch 0: both seed a generator with the seed).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from finetune.loop import batch_indices


def head_(weight: torch.Tensor, seed: int, std: float) -> torch.Tensor:
    """The Trainer's new head, drawn into `weight` (the process's generator is untouched)."""
    with torch.no_grad():
        return weight.normal_(0.0, std, generator=torch.Generator().manual_seed(seed))


def epoch_batches(num_examples: int, batch_size: int,
                  seed: int) -> Callable[[int], list[list[int]]]:
    """The Trainer's data order as `finetune.loop.train`'s `epoch_batches`. Call
    `torch.manual_seed(seed)` before training, as the Trainer's constructor does."""
    def batches(epoch: int) -> list[list[int]]:
        torch.empty((), dtype=torch.int64).random_()  # the DataLoader's base seed
        return batch_indices(num_examples, batch_size,
                             torch.Generator().manual_seed(seed + epoch))
    return batches
