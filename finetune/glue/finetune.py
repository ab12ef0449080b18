"""Fine-tune BERT on GLUE tasks with the paper's recipe (Devlin et al. 2019, section 4.1).

Defaults: max_seq_length 128, batch 32, 3 epochs, AdamW (weight decay 0.01 except biases and
LayerNorm, epsilon 1e-6, gradient clipping at 1.0 as the reference `optimization.py`), linear
warmup over 10% of the steps then linear decay to 0, learning rate picked among
5e-5/4e-5/3e-5/2e-5 on dev. Small tasks (CoLA, MRPC, STS-B, RTE, WNLI) run every seed and report
the mean and spread at the chosen rate; larger tasks run the first seed only. The best run's
weights predict the test sets for the leaderboard.

Batches are packed, not padded: the examples of a batch (the same 32 examples a padded batch
would hold) are laid out first-fit-decreasing into max_seq_length rows, and the encoder's
per-instance attention (`sequence_ids`) keeps each example on its own. The output of each
example is the same as alone; only the pad tokens' work is saved.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from finetune.glue import data as glue_data
from finetune.glue.metrics import compute_metrics, glue_score, task_score
from finetune.glue.tasks import TaskSpec
from model.bert import BertModel
from model.heads import BertForSequenceClassification
from pipelines.jobs import BadRecord

log = logging.getLogger(__name__)

PAPER_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)


@dataclass(frozen=True)
class FinetuneConfig:
    """The fine-tuning recipe; defaults are the paper's GLUE setup."""

    max_seq_length: int = 128
    """Longest input in tokens (pairs truncated longest-first)."""
    batch_size: int = 32
    """Training examples per optimizer step."""
    eval_batch_size: int = 256
    """Examples per evaluation batch (no effect on results)."""
    epochs: float = 3.0
    """Passes over the training data."""
    learning_rates: tuple[float, ...] = PAPER_LEARNING_RATES
    """Peak learning rates tried; the best mean dev score is kept."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds run on small tasks; other tasks use the first only."""
    warmup_proportion: float = 0.1
    """Fraction of the steps with the learning rate rising linearly from 0."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (not on biases and LayerNorm)."""
    adam_epsilon: float = 1e-6
    """AdamW epsilon (the reference BERT optimizer's)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    bf16: bool = False
    """Run forward and backward under bfloat16 autocast (CPU with AVX-512 bf16: ~2.5x faster)."""
    pack_sequences: bool = True
    """Pack each batch's examples into shared rows instead of padding them (same results)."""
    max_train_examples: int | None = None
    """Train on a fixed random subset of this many examples (None = all)."""
    max_eval_examples: int | None = None
    """Score a fixed random subset of this many dev examples per dev set (None = all)."""
    skip_bad_rows: bool = False
    """Set aside malformed rows (counted, and written to the dead-letter file) instead of
    stopping at the first."""
    predict_test: bool = True
    """Predict the test sets (when present) with the best run, for the leaderboard files."""
    progress: bool = True
    """Show progress bars."""
    device: str = "auto"
    """Where to fine-tune: "auto" (the GPU when torch sees one, else the CPU), "cpu", "cuda",
    "cuda:N"."""

    def __post_init__(self) -> None:
        if not 2 <= self.max_seq_length <= 512:
            raise ValueError(f"--max_seq_length must be in 2..512, got {self.max_seq_length}")
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.epochs > 0:
            raise ValueError(f"--epochs must be > 0, got {self.epochs}")
        if not self.learning_rates or any(not lr > 0 for lr in self.learning_rates):
            raise ValueError(f"--learning_rates must be positive, got {self.learning_rates}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seeds must be distinct and non-empty, got {self.seeds}")
        if not 0.0 <= self.warmup_proportion < 1.0:
            raise ValueError(f"--warmup_proportion must be in [0, 1), got {self.warmup_proportion}")
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if not self.adam_epsilon > 0:
            raise ValueError(f"--adam_epsilon must be > 0, got {self.adam_epsilon}")
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got "
                                 f"{self.device!r}") from None


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


def paper_recipe(**changes) -> FinetuneConfig:
    """The paper's GLUE recipe (the defaults), with overrides."""
    return FinetuneConfig(**changes)


def debug_recipe(**changes) -> FinetuneConfig:
    """A minutes-long run for tests and the demo: one rate, one seed, one epoch."""
    defaults = {"learning_rates": (5e-5,), "seeds": (1,), "epochs": 1.0}
    return FinetuneConfig(**{**defaults, **changes})


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunResult:
    """One fine-tuning run (one task, learning rate and seed) scored on dev."""

    task: str
    learning_rate: float
    seed: int
    metrics: dict[str, float]
    """Dev metrics as fractions, e.g. {"f1": 0.88, "accuracy": 0.84}."""
    score: float
    """Task score: the mean of `metrics`."""
    steps: int
    final_loss: float
    """Mean training loss over the last 10% of steps."""
    train_seconds: float
    eval_seconds: float


@dataclass(frozen=True)
class TestPredictions:
    """Predictions for one unlabelled test file, as the leaderboard wants them."""

    split: str
    submission_file: str
    guids: list[str]
    predictions: list[str]
    """Label strings ("entailment", "1") or scores formatted with 3 decimals (STS-B)."""


@dataclass(frozen=True)
class TaskResult:
    """A task fine-tuned over the learning-rate grid and seeds; the chosen rate's summary."""

    task: str
    best_learning_rate: float
    seeds: tuple[int, ...]
    metrics: dict[str, float]
    """Mean over seeds at the best rate."""
    metrics_std: dict[str, float]
    """Sample standard deviation over seeds (0 with one seed)."""
    score: float
    score_std: float
    runs: tuple[RunResult, ...]
    num_train_examples: int
    num_dev_examples: dict[str, int]
    bad_rows: int
    """Malformed rows set aside while reading (only with skip_bad_rows)."""
    seconds: float
    test_predictions: tuple[TestPredictions, ...] = ()
    bad_records: tuple[BadRecord, ...] = ()
    """The rows counted in `bad_rows` (file, line, reason, text) for the dead-letter file."""


@dataclass(frozen=True)
class GlueResult:
    """All tasks of one invocation and their GLUE score (mean of task scores)."""

    tasks: tuple[TaskResult, ...]
    glue_score: float
    model_dir: str
    config: FinetuneConfig
    seconds: float = 0.0
    pending_tasks: tuple[str, ...] = ()
    """Requested tasks not finished yet (in the report written after each finished task)."""


# ---------------------------------------------------------------------------------------------
# Data preparation
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreparedTask:
    """A task's tokenized splits, shared by every learning rate and seed."""

    task: TaskSpec
    train: glue_data.EncodedSplit
    dev: dict[str, glue_data.EncodedSplit]
    """Dev split name -> tokens (two for MNLI)."""
    test: dict[str, glue_data.EncodedSplit]
    bad_rows: int
    bad_records: tuple[BadRecord, ...] = ()
    """The `bad_rows` set aside (file, line, reason, raw text), for the dead-letter file."""


def subset(split: glue_data.GlueSplit, limit: int | None, seed: int = 0) -> glue_data.GlueSplit:
    """A fixed random subset of `limit` examples in file order (all when limit is None)."""
    if limit is None or limit >= len(split.examples):
        return split
    keep = np.sort(np.random.default_rng(seed).choice(len(split.examples), limit, replace=False))
    examples = [split.examples[i] for i in keep]
    return glue_data.GlueSplit(split.task, split.split, split.path, examples, split.bad_rows)


def prepare_task(task: TaskSpec, data_dir: str, tokenizer,
                 cfg: FinetuneConfig) -> PreparedTask:
    """Read and tokenize the train, dev and (when present) test files of `task`."""
    def load(split_spec, limit=None, required=True):
        split = glue_data.read_split(data_dir, task, split_spec, cfg.skip_bad_rows)
        if required and not split.examples:
            # 0 training steps or an empty dev set would still "score" and report a number.
            aside = f" ({len(split.bad_rows)} malformed rows set aside)" if split.bad_rows else ""
            raise glue_data.GlueFormatError(
                f"{split.path}: no {task.name} {split_spec.name} examples{aside}")
        return subset(split, limit)

    train = load(task.train, cfg.max_train_examples)
    devs = {s.name: load(s, cfg.max_eval_examples) for s in task.dev}
    tests = {}
    if cfg.predict_test:
        tests = {s.name: load(s, required=False) for s in task.test
                 if glue_data.has_split(data_dir, task, s)}
    # Subsets keep every bad row of the file: they were read, so they are reported.
    bad_records = tuple(b for s in (train, *devs.values(), *tests.values()) for b in s.bad_rows)
    if bad_records:
        log.warning("%s: set aside %d malformed rows (written to the dead-letter file of the "
                    "results)", task.name, len(bad_records))

    def encode(split):
        return glue_data.encode_split(tokenizer, split, task)

    return PreparedTask(task, encode(train), {k: encode(v) for k, v in devs.items()},
                        {k: encode(v) for k, v in tests.items()}, len(bad_records), bad_records)


# ---------------------------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedBatch:
    """Examples laid out in shared rows. R rows of T tokens, B examples, K slots per row."""

    input_ids: Tensor
    """(R, T) token ids, 0 after the last example of a row."""
    token_type_ids: Tensor
    """(R, T)"""
    sequence_ids: Tensor
    """(R, T) slot of the example each token belongs to, -1 for padding."""
    cls_positions: Tensor
    """(R, K) position of each slot's [CLS] (0 for empty slots)."""
    rows: Tensor
    """(B,) row of example b (in the order the batch was given)."""
    slots: Tensor
    """(B,) slot of example b within its row."""
    labels: Tensor
    """(B,) class ids or scores."""

    def to(self, device: torch.device) -> PackedBatch:
        """The batch on `device` (itself when it is there already)."""
        return PackedBatch(*(getattr(self, f.name).to(device)
                             for f in dataclasses.fields(self)))


def pack_rows(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """First-fit-decreasing: positions into `lengths` grouped into rows of <= row_length tokens."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > row_length:
            raise ValueError(f"example of {lengths[i]} tokens exceeds the row length {row_length}")
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(row_length - lengths[i])
    return rows


def pack_batch(encoded: glue_data.EncodedSplit, indices: Sequence[int],
               row_length: int | None = None) -> PackedBatch:
    """The examples at `indices` packed into rows of at most `row_length` tokens.

    The default row length is the batch's longest example: rows no longer than a padded
    batch's. Longer rows pack tighter; the model attends within each example either way.
    """
    lengths = [len(encoded.input_ids[i]) for i in indices]
    layout = pack_rows(lengths, row_length or max(lengths))
    width = max(sum(lengths[j] for j in row) for row in layout)
    slots_per_row = max(len(row) for row in layout)
    input_ids = np.zeros((len(layout), width), np.int64)  # (R, T)
    token_type_ids = np.zeros((len(layout), width), np.int64)  # (R, T)
    sequence_ids = np.full((len(layout), width), -1, np.int64)  # (R, T)
    cls_positions = np.zeros((len(layout), slots_per_row), np.int64)  # (R, K)
    rows = np.zeros(len(indices), np.int64)
    slots = np.zeros(len(indices), np.int64)
    for r, row in enumerate(layout):
        start = 0
        for k, j in enumerate(row):
            i, n = indices[j], lengths[j]
            input_ids[r, start:start + n] = encoded.input_ids[i]
            token_type_ids[r, start:start + n] = encoded.token_type_ids[i]
            sequence_ids[r, start:start + n] = k
            cls_positions[r, k] = start
            rows[j], slots[j] = r, k
            start += n
    labels = torch.from_numpy(encoded.labels[list(indices)])
    return PackedBatch(*(torch.from_numpy(a) for a in (input_ids, token_type_ids, sequence_ids,
                                                        cls_positions, rows, slots)), labels)


def padded_batch(encoded: glue_data.EncodedSplit, indices: Sequence[int]) -> PackedBatch:
    """The examples at `indices` one per row, padded to the longest (the unpacked layout)."""
    b = glue_data.collate(encoded, indices)
    n = len(indices)
    sequence_ids = b.attention_mask.long() - 1  # (B, T): 0 for tokens, -1 for padding
    return PackedBatch(b.input_ids, b.token_type_ids, sequence_ids,
                       torch.zeros((n, 1), dtype=torch.long), torch.arange(n),
                       torch.zeros(n, dtype=torch.long), b.labels)


def make_batch(encoded: glue_data.EncodedSplit, indices: Sequence[int],
               cfg: FinetuneConfig) -> PackedBatch:
    if cfg.pack_sequences:
        # Attention runs per example (model.attention.attention_plan), so a row's length costs only
        # its padding: full max_seq_length rows pack tightest (MRPC: 1,813 tokens per batch of
        # 32 vs 2,110 with rows as long as the longest example, 16% less CPU per step).
        return pack_batch(encoded, indices, cfg.max_seq_length)
    return padded_batch(encoded, indices)


def classifier_logits(model: BertForSequenceClassification, batch: PackedBatch) -> Tensor:
    """(B, num_labels) logits of the batch's examples in their given order.

    The computation of `BertForSequenceClassification.forward` (dropout + linear on the pooled
    [CLS]) on packed rows: each slot's [CLS] is pooled, then rows/slots restore batch order.
    """
    hidden = model.bert(batch.input_ids, batch.token_type_ids,
                        sequence_ids=batch.sequence_ids)  # (R, T, H)
    pooled = model.bert.pool(hidden, batch.cls_positions)  # (R, K, H)
    pooled = pooled[batch.rows, batch.slots]  # (B, H)
    return model.classifier(model.dropout(pooled))


def loss_fn(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy for classification, mean squared error for regression (one output)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels.long())


# ---------------------------------------------------------------------------------------------
# Model, optimizer, schedule
# ---------------------------------------------------------------------------------------------

def load_encoder(model_dir: str) -> BertModel:
    """Our `BertModel` with the weights of `model_dir`: a folder `model.hf.save_checkpoint` wrote
    (`bert_config.json`), or our HF export / any Hugging Face BERT folder (`config.json`).

    Errors name the folder: a config that is not JSON, weights that are not readable, and
    weights whose shapes differ from the config's (a config.json of another model size).
    """
    from safetensors import SafetensorError

    from model import hf

    if os.path.isfile(os.path.join(model_dir, hf.CHECKPOINT_CONFIG)):
        config_name, load = hf.CHECKPOINT_CONFIG, hf.load_checkpoint
    elif os.path.isfile(os.path.join(model_dir, "config.json")):
        config_name, load = "config.json", hf.load_hf_encoder
    else:
        raise FileNotFoundError(f"--model {model_dir}: no {hf.CHECKPOINT_CONFIG} or config.json")
    try:
        model = load(model_dir)
    except json.JSONDecodeError as e:
        raise ValueError(f"--model {model_dir}: {config_name} is not JSON ({e})") from None
    except (SafetensorError, RuntimeError) as e:  # torch.load_state_dict / unreadable weights
        raise ValueError(f"--model {model_dir}: {weights_error(e, config_name)}") from e
    except (ValueError, TypeError) as e:  # the config's values; model.hf names the file itself
        if model_dir in str(e):
            raise
        raise ValueError(f"--model {model_dir}: {config_name}: {e}") from e
    return model if isinstance(model, BertModel) else model.bert


_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape "
                            r"torch\.Size\((\[.*?\])\) from checkpoint, the shape in current "
                            r"model is torch\.Size\((\[.*?\])\)")


def weights_error(error: Exception, config_name: str, shown: int = 3) -> str:
    """One line for a checkpoint that does not load: its first shape mismatches, if any."""
    mismatches = _SIZE_MISMATCH.findall(str(error))
    if not mismatches:
        return f"cannot load the weights: {str(error).strip().splitlines()[0]}"
    listed = "; ".join(f"{name} is {saved} in the weights but {expected} by {config_name}"
                       for name, saved, expected in mismatches[:shown])
    more = f" (and {len(mismatches) - shown} more)" if len(mismatches) > shown else ""
    return f"the weights do not match {config_name}: {listed}{more}"


def check_model_fits(encoder: BertModel, tokenizer, tasks: Sequence[TaskSpec],
                     cfg: FinetuneConfig, model_dir: str, tokenizer_dir: str) -> None:
    """Raise before any training when the encoder cannot embed what the tokenizer and the
    recipe give it; warn when the tokenizer uses only part of the model's vocabulary.

    A token id >= vocab_size or a position >= max_position_embeddings would otherwise stop
    training with an IndexError deep in torch; a smaller vocabulary runs but maps text to
    rows the model learnt for other tokens (most likely the wrong vocab.txt).
    """
    config = encoder.config
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    num_ids = max(ids) + 1 if ids else 0  # not the token count: ids can have gaps
    if num_ids > config.vocab_size:
        raise ValueError(
            f"tokenizer of {tokenizer_dir} gives token ids up to {num_ids - 1} ({num_ids} ids) "
            f"but the model {model_dir} has vocab_size {config.vocab_size}: use the model's "
            "own vocabulary (--vocab)")
    if num_ids < config.vocab_size:
        log.warning("tokenizer of %s has %d token ids but the model %s has vocab_size %d: "
                    "check that it is the vocabulary the model was trained with",
                    tokenizer_dir, num_ids, model_dir, config.vocab_size)
    if cfg.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {cfg.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings} ({model_dir})")
    pairs = [t.name for t in tasks if len(t.hf_text_fields) == 2]
    if pairs and config.type_vocab_size < 2:
        raise ValueError(f"{', '.join(pairs)}: sentence pairs need 2 token types but the model "
                         f"{model_dir} has type_vocab_size {config.type_vocab_size}")


_SEEDING = threading.Lock()


def build_model(encoder: BertModel, num_labels: int, seed: int,
                device: torch.device | str = "cpu") -> BertForSequenceClassification:
    """A classifier over a copy of `encoder`'s weights on `device`; the new head initialised
    from `seed` on the CPU (the same head on any device), the device's dropout stream seeded.

    Only this run's generators are seeded: `torch.manual_seed` would reseed every GPU, under
    runs that the flow trains on other GPUs from other threads at the same time.
    """
    device = torch.device(device)
    with _SEEDING:  # the CPU generator is the process's: one run seeds and draws at a time
        torch.random.default_generator.manual_seed(seed)
        model = BertForSequenceClassification.from_encoder(encoder, num_labels)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
    return model.to(device)


def build_optimizer(model: nn.Module, learning_rate: float,
                    cfg: FinetuneConfig) -> torch.optim.Optimizer:
    """AdamW; biases and LayerNorm parameters are not decayed (as the reference optimizer)."""
    no_decay = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm)
                for p in m.parameters(recurse=False)}
    no_decay |= {id(p) for name, p in model.named_parameters() if name.endswith("bias")}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0},
    ]
    # fused: one kernel over all parameters (the default of transformers' Trainer as well).
    return torch.optim.AdamW(groups, lr=learning_rate, eps=cfg.adam_epsilon, fused=True)


def warmup_linear_decay(optimizer: torch.optim.Optimizer, total_steps: int,
                        warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning rate rising linearly from 0 over warmup_steps, then falling linearly to 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def num_training_steps(num_examples: int, cfg: FinetuneConfig) -> int:
    return math.ceil(math.ceil(num_examples / cfg.batch_size) * cfg.epochs)


# ---------------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------------

def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def train_step(model: BertForSequenceClassification, batch: PackedBatch,
               optimizer: torch.optim.Optimizer, scheduler, cfg: FinetuneConfig) -> float:
    """One optimizer step on one batch (moved to the model's device); returns the loss."""
    device = next(model.parameters()).device
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        loss = loss_fn(classifier_logits(model, batch), batch.labels)
    loss.backward()
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def train(model: BertForSequenceClassification, train_set: glue_data.EncodedSplit,
          learning_rate: float, seed: int, cfg: FinetuneConfig, desc: str = "",
          epoch_batches: Callable[[int], list[list[int]]] | None = None) -> list[float]:
    """Fine-tune `model` in place with the recipe; returns the loss of every step.

    The data order: `epoch_batches(epoch)` gives each epoch's batches of example indices;
    by default one generator seeded with `seed` shuffles anew every epoch.
    """
    total = num_training_steps(len(train_set), cfg)
    optimizer = build_optimizer(model, learning_rate, cfg)
    scheduler = warmup_linear_decay(optimizer, total, math.ceil(total * cfg.warmup_proportion))
    if epoch_batches is None:
        generator = torch.Generator().manual_seed(seed)

        def epoch_batches(epoch: int) -> list[list[int]]:
            return glue_data.batch_indices(len(train_set), cfg.batch_size, generator)
    model.train()
    losses: list[float] = []
    epoch = 0
    with _progress(total, desc, cfg.progress) as bar:
        while len(losses) < total:
            batches, epoch = epoch_batches(epoch), epoch + 1
            for indices in batches:
                if len(losses) == total:  # a fractional last epoch stops mid-way
                    break
                losses.append(train_step(model, make_batch(train_set, indices, cfg),
                                         optimizer, scheduler, cfg))
                if not math.isfinite(losses[-1]):
                    raise FloatingPointError(f"{desc or 'fine-tuning'}: loss {losses[-1]} at "
                                             f"step {len(losses)}; lower the learning rate")
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    return losses


@torch.inference_mode()
def predict(model: BertForSequenceClassification, encoded: glue_data.EncodedSplit,
            cfg: FinetuneConfig) -> np.ndarray:
    """Class ids (N,) or scores (N,) for every example, in the split's order."""
    model.eval()
    device = next(model.parameters()).device
    # Batches of similar length (sorted) waste the least; outputs do not depend on the order.
    order = np.argsort(encoded.lengths, kind="stable")
    outputs = np.zeros(len(encoded), dtype=np.float32 if model.num_labels == 1 else np.int64)
    for start in range(0, len(order), cfg.eval_batch_size):
        indices = order[start:start + cfg.eval_batch_size].tolist()
        batch = make_batch(encoded, indices, cfg).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = classifier_logits(model, batch).float()
        values = logits.squeeze(-1) if model.num_labels == 1 else logits.argmax(-1)
        outputs[indices] = values.cpu().numpy()
    return outputs


def evaluate(model: BertForSequenceClassification, prepared: PreparedTask,
             cfg: FinetuneConfig) -> dict[str, float]:
    """The task's dev metrics over all its dev splits (MNLI: "accuracy_m", "accuracy_mm")."""
    metrics: dict[str, float] = {}
    for spec in prepared.task.dev:
        encoded = prepared.dev[spec.name]
        metrics.update(compute_metrics(prepared.task, encoded.labels, predict(model, encoded, cfg),
                                       suffix=spec.metric_suffix))
    return metrics


def run_one(encoder: BertModel, prepared: PreparedTask, learning_rate: float, seed: int,
            cfg: FinetuneConfig) -> tuple[RunResult, BertForSequenceClassification]:
    """Fine-tune a fresh classifier for one (rate, seed) and score it on dev."""
    task = prepared.task
    model = build_model(encoder, task.num_labels, seed, resolve_device(cfg.device))
    start = time.perf_counter()
    losses = train(model, prepared.train, learning_rate, seed, cfg,
                   desc=f"{task.name} lr={learning_rate:g} seed={seed}")
    trained = time.perf_counter()
    metrics = evaluate(model, prepared, cfg)
    tail = losses[-max(1, len(losses) // 10):]
    result = RunResult(task.name, learning_rate, seed, metrics, task_score(metrics), len(losses),
                       float(np.mean(tail)), trained - start, time.perf_counter() - trained)
    log.info("%s lr=%g seed=%d: %s", task.name, learning_rate, seed,
             ", ".join(f"{k}={100 * v:.2f}" for k, v in metrics.items()))
    return result, model


def predict_test_sets(model: BertForSequenceClassification, prepared: PreparedTask,
                     cfg: FinetuneConfig) -> tuple[TestPredictions, ...]:
    """Leaderboard predictions for every test file that was read."""
    out = []
    for spec in prepared.task.test:
        if spec.name not in prepared.test:
            continue
        encoded = prepared.test[spec.name]
        values = predict(model, encoded, cfg)
        if prepared.task.is_regression:
            # STS-B gold scores lie in [0, 5]; clipping can only bring predictions closer.
            labels = [f"{v:.3f}" for v in np.clip(values, 0.0, 5.0)]
        else:
            labels = [prepared.task.labels[v] for v in values]
        out.append(TestPredictions(spec.name, spec.submission_file, list(encoded.guids), labels))
    return tuple(out)


@dataclass(frozen=True)
class BestRuns:
    """The learning rate a task reports and the run whose weights predict its test sets."""

    learning_rate: float
    """The rate with the best mean dev score over its seeds (the first such rate on ties)."""
    runs: tuple[RunResult, ...]
    """The runs at `learning_rate`, one per seed, in run order."""
    best_run: RunResult
    """The best-scoring seed at `learning_rate` (the first on ties)."""


def select_best(runs: Sequence[RunResult]) -> BestRuns:
    """The best learning rate by mean dev score over seeds, and its best seed.

    The one rule of both GLUE paths (`finetune_task` here and the flow's fan-out), so the
    reported rate, its mean and the test-set predictions always come from the same runs; the
    best single run of another rate (a lucky seed) never predicts the test sets.
    """
    if not runs:
        raise ValueError("select_best: no runs")
    rates = list(dict.fromkeys(r.learning_rate for r in runs))
    by_rate = {lr: [r for r in runs if r.learning_rate == lr] for lr in rates}
    best_lr = max(rates, key=lambda lr: statistics.fmean(r.score for r in by_rate[lr]))
    chosen = by_rate[best_lr]
    return BestRuns(best_lr, tuple(chosen), max(chosen, key=lambda r: r.score))


def summarise_task(task: str, runs: Sequence[RunResult], num_train_examples: int,
                   num_dev_examples: dict[str, int], bad_rows: int, seconds: float,
                   test_predictions: tuple[TestPredictions, ...] = (),
                   bad_records: tuple[BadRecord, ...] = ()) -> TaskResult:
    """A task's result from all its runs: the `select_best` rate's mean and spread over seeds.

    `test_predictions` must be those of `select_best(runs).best_run`."""
    best = select_best(runs)
    names = list(best.runs[0].metrics)
    mean = {n: statistics.fmean(r.metrics[n] for r in best.runs) for n in names}
    std = {n: statistics.stdev(r.metrics[n] for r in best.runs) if len(best.runs) > 1 else 0.0
           for n in names}
    scores = [r.score for r in best.runs]
    return TaskResult(
        task=task, best_learning_rate=best.learning_rate,
        seeds=tuple(r.seed for r in best.runs), metrics=mean, metrics_std=std,
        score=statistics.fmean(scores),
        score_std=statistics.stdev(scores) if len(scores) > 1 else 0.0, runs=tuple(runs),
        num_train_examples=num_train_examples, num_dev_examples=num_dev_examples,
        bad_rows=bad_rows, seconds=seconds, test_predictions=test_predictions,
        bad_records=bad_records)


def finetune_task(encoder: BertModel, prepared: PreparedTask, cfg: FinetuneConfig) -> TaskResult:
    """The learning-rate grid x seeds for one task; the rate with the best mean dev score wins,
    and its best seed predicts the test sets (`select_best`)."""
    task = prepared.task
    seeds = cfg.seeds if task.small else cfg.seeds[:1]
    start = time.perf_counter()
    runs: list[RunResult] = []
    # The weights of the best seed at the best rate so far: a rate's mean is known once its
    # seeds are done, and a rate that is not best then never becomes the overall best later
    # (select_best keeps the first rate on ties), so one kept copy (+ the current rate's) does.
    kept: tuple[RunResult, dict] | None = None
    for learning_rate in cfg.learning_rates:
        rate_best: tuple[RunResult, dict] | None = None
        for seed in seeds:
            result, model = run_one(encoder, prepared, learning_rate, seed, cfg)
            runs.append(result)
            if prepared.test and (rate_best is None or result.score > rate_best[0].score):
                rate_best = (result, copy.deepcopy(model.state_dict()))
            del model
        if rate_best is not None and select_best(runs).best_run is rate_best[0]:
            kept = rate_best
    predictions: tuple[TestPredictions, ...] = ()
    if prepared.test:
        assert kept is not None and kept[0] is select_best(runs).best_run
        model = build_model(encoder, task.num_labels, kept[0].seed, resolve_device(cfg.device))
        model.load_state_dict(kept[1])
        predictions = predict_test_sets(model, prepared, cfg)
    return summarise_task(task.name, runs, len(prepared.train),
                          {k: len(v) for k, v in prepared.dev.items()}, prepared.bad_rows,
                          time.perf_counter() - start, predictions, prepared.bad_records)


def run_glue(model_dir: str, data_dir: str, tasks: Sequence[TaskSpec],
             cfg: FinetuneConfig, vocab_dir: str | None = None,
             on_task_done: Callable[[GlueResult], None] | None = None) -> GlueResult:
    """Fine-tune the checkpoint in `model_dir` on each task of `tasks` with data from `data_dir`.

    The tokenizer is the one in `vocab_dir` if given, else the checkpoint folder's. Every data
    file, the checkpoint and the tokenizer are checked before the first task trains; after each
    task, `on_task_done` gets the result so far (the finished tasks, the others pending), so a
    later failure loses no finished work.
    """
    if not tasks:
        raise ValueError("--tasks: no task given")
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"--data {data_dir}: no such folder")
    start = time.perf_counter()
    resolve_device(cfg.device)
    glue_data.check_task_files(data_dir, tasks, cfg.predict_test)
    encoder = load_encoder(model_dir)
    tokenizer_dir = vocab_dir or model_dir
    tokenizer = glue_data.load_glue_tokenizer(tokenizer_dir, cfg.max_seq_length)
    check_model_fits(encoder, tokenizer, tasks, cfg, model_dir, tokenizer_dir)
    results: list[TaskResult] = []
    for i, task in enumerate(tasks):
        prepared = prepare_task(task, data_dir, tokenizer, cfg)
        results.append(finetune_task(encoder, prepared, cfg))
        combined = dataclasses.replace(
            combine_results(results, model_dir, cfg), seconds=time.perf_counter() - start,
            pending_tasks=tuple(t.name for t in tasks[i + 1:]))
        if on_task_done is not None:
            on_task_done(combined)
    return combined


def combine_results(results: Sequence[TaskResult], model_dir: str,
                    cfg: FinetuneConfig) -> GlueResult:
    """One GlueResult from tasks fine-tuned separately (e.g. fanned out by a flow)."""
    if not results:
        raise ValueError("combine_results: no task results")
    return GlueResult(tuple(results), glue_score({r.task: r.score for r in results}), model_dir,
                      cfg, sum(r.seconds for r in results))
