"""The optimizer's parameter groups and the learning-rate schedule, shared by pre-training
(handed to DeepSpeed by training/ds_config.py) and fine-tuning (finetune/loop.py).

AdamW's weight decay skips LayerNorm weights and every bias, as the reference optimizer
(`optimization.py`, `exclude_from_weight_decay`). Two schedules:

- `LinearWarmupDecay` (BERT's, fine-tuning's): rises linearly from 0 over the warmup steps,
  then falls linearly to 0 at the last step (the paper, section A.2 and A.3).
- `WarmupStableDecay` (WSD, as ModernBERT, mmBERT and EuroBERT train): the same warmup, then
  the peak held (the stable phase), then a decay to 0 over the last `decay_steps` in a shape of
  `DECAY_SHAPES`. With no decay steps a phase ends at the peak: its checkpoints are the stable
  phase's, which a later run decays from (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
  Training Beyond Fixed Training Durations": 1-sqrt decay over 10-20% of the steps matches
  cosine).

Pure torch: nothing here imports DeepSpeed.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed weights, and LayerNorm weights + every bias without decay."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue  # tied weights (MLM decoder = word embeddings) appear twice
            seen.add(id(param))
            if isinstance(module, nn.LayerNorm) or name.endswith("bias"):
                no_decay.append(param)
            else:
                decay.append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class LinearWarmupDecay:
    """The learning rate per optimizer step; call `step()` after each one.

    Step s runs at `lr * s / warmup` for s < warmup (so, like the reference's optimization.py,
    the first step runs at lr 0 when there is a warmup), then `lr * (steps - s) / (steps -
    warmup)`. `steps_taken` counts the calls of `step()`, i.e. the optimizer steps done, so the
    next step runs at `lr_at(steps_taken)`. With fp16, DeepSpeed skips `step()` on a step it
    drops for a gradient overflow: the schedule then runs behind by the dropped steps (bf16 and
    fp32 drop none). State: `{"steps_taken": n}` (saved and restored with checkpoints).
    """

    def __init__(self, optimizer: Optimizer, learning_rate: float, warmup_steps: int,
                 total_steps: int):
        if not 0 <= warmup_steps <= total_steps or total_steps <= 0:
            raise ValueError(f"warmup_steps={warmup_steps} must be in [0, steps={total_steps}]")
        self.optimizer = optimizer
        self.learning_rate, self.warmup_steps = learning_rate, warmup_steps
        self.total_steps = total_steps
        self.steps_taken = 0
        self._apply()

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.learning_rate * step / self.warmup_steps
        remaining = max(0, self.total_steps - step)
        return self.learning_rate * remaining / max(1, self.total_steps - self.warmup_steps)

    def _apply(self) -> None:
        lr = self.lr_at(self.steps_taken)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.steps_taken += 1
        self._apply()

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return self.get_lr()

    def state_dict(self) -> dict[str, int]:
        return {"steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if "steps_taken" in state:
            self.steps_taken = int(state["steps_taken"])
        else:  # a checkpoint of DeepSpeed's WarmupDecayLR: its step counter
            self.steps_taken = int(state["last_batch_iteration"]) + 1
        self._apply()


DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: 1.0 - p,
    "1-sqrt": lambda p: 1.0 - math.sqrt(p),
    "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
}
"""The share of the peak learning rate at decay progress p in [0, 1] (1 at p = 0, 0 at p = 1)."""


class WarmupStableDecay(LinearWarmupDecay):
    """Warmup as `LinearWarmupDecay`, then the peak until the last `decay_steps` steps, which
    fall to 0 in `shape` (`DECAY_SHAPES`): step s of the decay (s = 0 its first) runs at
    `lr * shape(s / decay_steps)`, so the decay's first step is at the peak and the rate
    reaches 0 after the phase's last step. State as `LinearWarmupDecay`'s."""

    def __init__(self, optimizer: Optimizer, learning_rate: float, warmup_steps: int,
                 total_steps: int, decay_steps: int = 0, shape: str = "1-sqrt"):
        if not 0 <= decay_steps <= total_steps - warmup_steps:
            raise ValueError(f"decay_steps={decay_steps} must be in [0, steps - warmup_steps = "
                             f"{total_steps - warmup_steps}]")
        if shape not in DECAY_SHAPES:
            raise ValueError(f"decay shape {shape!r}: expected one of {sorted(DECAY_SHAPES)}")
        self.decay_steps, self.shape = decay_steps, DECAY_SHAPES[shape]
        super().__init__(optimizer, learning_rate, warmup_steps, total_steps)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.learning_rate * step / self.warmup_steps
        decay_start = self.total_steps - self.decay_steps
        if step < decay_start:
            return self.learning_rate
        progress = min(1.0, (step - decay_start) / max(1, self.decay_steps))
        return self.learning_rate * self.shape(progress)


@dataclass(frozen=True)
class BatchWarmup:
    """The global batch of each optimizer step while it grows with the tokens trained (as
    ModernBERT's and mmBERT's batch-size warmup): `start_rows` at the first step, linearly to
    `end_rows` once `tokens` tokens are trained, each step's rows a multiple of `granule` (the
    micro-batch x ranks: whole micro-batches on every rank)."""

    start_rows: int
    end_rows: int
    tokens: int
    row_tokens: int
    """Tokens a row counts for (the phase's max_seq_length)."""
    granule: int

    def rows(self, steps: int) -> list[int]:
        """Rows of optimizer steps 0..steps-1: a function of the step alone, so a resumed run
        trains each step at the batch the uninterrupted one did."""
        out, seen = [], 0
        for _ in range(steps):
            share = min(1.0, seen / self.tokens)
            rows = self.start_rows + (self.end_rows - self.start_rows) * share
            rows = max(self.granule, int(rows) // self.granule * self.granule)
            out.append(rows)
            seen += rows * self.row_tokens
        return out
