"""The fine-tuning loop's settings: `LoopOptions` (the same for every task), `FinetuneConfig`
(one task's: its family's recipe with the loop's options, `for_recipe`), `TaskJob` (one task of
an invocation) and the device they name (`resolve_device`, `uses_bf16`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from common.optimizer import AdamWOptions
from common.settings import SettingError, check, check_choices
from finetune.family import Family, Recipe
from training.trackers import check_names as check_trackers

HeadInit = Literal["truncated_normal", "normal"]
HEAD_INITS = get_args(HeadInit)
RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe))
"""The settings a family's recipe gives: max_seq_length, batch_size, epochs, learning_rates."""


@dataclass(frozen=True)
class LoopOptions(AdamWOptions):
    """The loop's settings that no family's recipe gives: the same for every task. The flow's
    `finetune` section and `bert-finetune` take them as they are (finetune/config.py); the
    optimizer's (`weight_decay`, `adam_epsilon`, `max_grad_norm`) are pre-training's too
    (common/optimizer.py)."""

    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds run on small tasks (GLUE: CoLA, MRPC, STS-B, RTE, WNLI); other tasks use the first."""
    eval_batch_size: int = 256
    """Units per evaluation batch (no effect on results)."""
    warmup_proportion: float = 0.1
    """Fraction of the steps with the learning rate rising linearly from 0."""
    bf16: bool | None = None
    """bfloat16 autocast for forward and backward; unset: on a GPU yes, on the CPU no (CPUs with
    AVX-512 bf16 run ~2.5x faster with it)."""
    max_train_examples: int | None = None
    """Train on a fixed random subset of this many examples per task (unset: all)."""
    max_eval_examples: int | None = None
    """Score a fixed random subset of this many dev examples per dev set (unset: all)."""
    skip_bad_rows: bool = False
    """Set aside malformed records (counted, and written to the dead-letter file) instead of
    stopping at the first."""
    progress: bool = True
    """Show progress bars."""
    report_to: tuple[str, ...] = ()
    """Experiment trackers for each (task, rate, seed) run: mlflow, wandb, tensorboard
    (comma-separated), or none; their files go in the output folder (training/trackers.py)."""
    device: str = "auto"
    """Where to fine-tune: auto (the GPU when torch sees one, else the CPU), cpu, cuda or
    cuda:N."""
    head_init: HeadInit = "truncated_normal"
    """The new head's initial weights: truncated_normal (N(0, 0.02) cut at 2 std, std 0.0176:
    BERT's reference run_classifier.py / run_squad.py) or normal (N(0, 0.02) uncut, 1.137x
    wider: transformers' heads). On short runs the wider head learns measurably faster (NER,
    benchmarks/RESULTS.md section 13, 8d)."""
    row_length: int | None = None
    """Tokens per packed row (>= max_seq_length, <= the model's max_position_embeddings). Unset:
    on the CPU 512 (or the model's max_position_embeddings if smaller): attention runs per
    sequence there, so a longer row costs only its padding and packs tighter (Cosmos QA: 15%
    fewer tokens per batch than rows of 128; 0.76x the Trainer's time against 0.85x, RESULTS
    11c); on a GPU max_seq_length: attention takes whole rows under a mask there, at
    row_length^2 each."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(bool(self.seeds) and len(set(self.seeds)) == len(self.seeds), "seeds",
              f"must be distinct and non-empty, got {self.seeds}")
        check(self.eval_batch_size >= 1, "eval_batch_size",
              f"must be >= 1, got {self.eval_batch_size}")
        check(0.0 <= self.warmup_proportion < 1.0, "warmup_proportion",
              f"must be in [0, 1), got {self.warmup_proportion}")
        self.check_adamw()
        check(self.row_length is None or self.row_length >= 1, "row_length",
              f"must be >= 1, got {self.row_length}")
        check_trackers(self.report_to)
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, f"must be >= 1, got {value}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise SettingError("device", "must be auto, cpu, cuda or cuda:N, got "
                                   f"{self.device!r}") from None


@dataclass(frozen=True)
class FinetuneConfig(LoopOptions, Recipe):
    """One task's settings as the loop runs them: a family's recipe (defaults: the paper's GLUE
    recipe) and the loop's options."""

    def __post_init__(self) -> None:
        LoopOptions.__post_init__(self)
        Recipe.__post_init__(self)
        check(self.row_length is None or self.row_length >= self.max_seq_length, "row_length",
              f"must be >= max_seq_length {self.max_seq_length}, got {self.row_length}")


def for_recipe(recipe: Recipe, **changes) -> FinetuneConfig:
    """The loop's settings with a family's recipe, then `changes` (flags the user gave)."""
    return FinetuneConfig(**{**dataclasses.asdict(recipe), **changes})


def resolve_device(name: str) -> torch.device:
    """`FinetuneConfig.device` as a torch device; a GPU torch cannot see is an error here,
    before any training, not a CUDA error at the first batch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"--device {name}: torch sees {count} GPU(s) here")
    return device


def uses_bf16(cfg: FinetuneConfig, device: torch.device) -> bool:
    """Whether runs on `device` autocast to bfloat16 (`FinetuneConfig.bf16`)."""
    return device.type == "cuda" if cfg.bf16 is None else cfg.bf16


@dataclass(frozen=True)
class TaskJob:
    """One task of an invocation: its family, data folder and resolved settings."""

    family: Family
    task: str
    data_dir: str
    """The family's folder (GLUE: the glue_data layout)."""
    config: FinetuneConfig
