"""Typed configuration of a pre-training run: presets, file/CLI overrides, validation.

A run is a sequence of phases (the paper, section A.2: 90% of the steps at 128 tokens, then 10%
at 512 tokens). Each phase has its own shards, batch and learning-rate schedule; phase 2 starts
from phase 1's weights with a fresh optimizer and schedule.

Overrides, applied in order after the preset:
- `--config run.yaml` (or `.json`): a nested mapping of the fields below; `phases` a list,
  the run's phases, each merged into the preset's phase of its name (`_merge_phases`).
- `--set key=value` (repeatable): dotted keys, `zero_stage=2`, `phases.0.steps=300` or by phase
  name, `phase1.learning_rate=5e-4`. Each value is converted to its field's type by
  `common.settings.convert_setting`, the converter the flow's `--set` uses too (`1e-4` a
  float, `true`/`false` a bool, text as given).

A phase shortened without its `warmup_steps` keeps the preset's warmup share (tiny:
`phase1.steps=30` -> warmup 60 x 30/600 = 3, logged); a warmup set beside it is kept, and one
longer than the phase is an error naming the setting as written, with both values.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from common import settings
from common.masking import MaskingConfig, MaskSplit
from common.settings import SettingError, convert_setting
from model.bert import PRESETS as MODEL_PRESETS

log = logging.getLogger(__name__)

SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""Model shape settings that override the preset's (0 = the preset's value)."""
MASKING_FIELDS = ("masked_lm_prob", *(f.name for f in dataclasses.fields(MaskSplit)))
"""Settings of dynamic masking (`dynamic_masking=true`)."""


def _check(ok: bool, flag: str, expected: str) -> None:
    if not ok:
        raise SettingError(flag, f"must be {expected}", "--set {setting}: {message}")


@dataclass(frozen=True)
class PhaseConfig:
    """One pre-training phase: its data, sequence length, batch and schedule."""
    name: str = "phase1"
    """Phase name, used in checkpoint tags and `--set <name>.<field>=...`."""
    train_shards: str = ""
    """Shard folder or URL holding `manifest.json` + `train-*.tar` (see training/loader.py)."""
    validation_shards: str = ""
    """Held-out shard folder or URL (`validation-*.tar`); empty = the train location."""
    max_seq_length: int = 128
    """Tokens per row; must equal the shards' `max_seq_length`."""
    micro_batch_size: int = 32
    """Rows per rank per forward/backward (DeepSpeed's train_micro_batch_size_per_gpu)."""
    global_batch_size: int = 256
    """Rows per optimizer step over all ranks; gradient accumulation = global / (micro x ranks)."""
    steps: int = 900_000
    """Optimizer steps in this phase."""
    warmup_steps: int = 10_000
    """Linear warmup steps from 0 to `learning_rate` (0 = start at the peak), then linear decay
    to 0 at `steps` (training/optim.py `LinearWarmupDecay`). Left unset while `steps` is
    shortened, it shrinks in proportion (`PhaseConfig.follow_changes`)."""
    learning_rate: float = 1e-4
    """Peak learning rate."""

    def __post_init__(self):
        _check(bool(self.name) and "/" not in self.name, "name", "a non-empty name without '/'")
        for flag in ("max_seq_length", "micro_batch_size", "global_batch_size", "steps"):
            _check(getattr(self, flag) > 0, flag, "positive")
        _check(0 <= self.warmup_steps <= self.steps, "warmup_steps",
               f"in [0, steps={self.steps}], got {self.warmup_steps}")
        _check(self.learning_rate > 0, "learning_rate", "positive")
        _check(self.global_batch_size % self.micro_batch_size == 0, "global_batch_size",
               f"a multiple of micro_batch_size={self.micro_batch_size}")

    def follow_changes(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """`changes` (of this phase) plus the warmup scaled with a shortened `steps` where
        `changes` leave `warmup_steps` unset: a short run of a preset keeps its warmup share
        (tiny: 600 steps / 60 warmup, `phase1.steps=30` -> 3), which `common.settings.apply`
        and config files (`_merge_phases`) apply alike."""
        steps = changes.get("steps", self.steps)
        if "warmup_steps" in changes or not 0 < steps < self.steps:
            return dict(changes)
        warmup = min(steps, max(0, round(self.warmup_steps * steps / self.steps)))
        if warmup != self.warmup_steps:
            log.info("%s.steps=%d: warmup_steps scaled with it, %d -> %d", self.name, steps,
                     self.warmup_steps, warmup)
        return {**changes, "warmup_steps": warmup}

    def gradient_accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per rank per optimizer step for `world_size` ranks."""
        per_step = self.micro_batch_size * world_size
        if self.global_batch_size % per_step:
            raise ValueError(f"{self.name}.global_batch_size={self.global_batch_size} is not a "
                             f"multiple of micro_batch_size x ranks = {per_step}")
        return self.global_batch_size // per_step


@dataclass(frozen=True)
class PretrainConfig(MaskSplit):
    """A whole pre-training run. The MASK/SAME/RND split and `do_whole_word_mask` (from
    `common.masking.MaskSplit`) act with `dynamic_masking=true` only."""
    model: str = "bert_tiny"
    """Model preset in model.bert (bert_tiny, bert_mini, bert_base, bert_large); the shape
    fields below override its shape (paper Table 6). "" with `init_from`: the checkpoint's shape
    (what `--set init_from=...` alone resolves to); a preset or shape field named together with
    `init_from` must agree with the checkpoint."""
    init_from: str = ""
    """Checkpoint to continue pre-training from: a Hugging Face BERT folder (BertModel or
    BertForPreTraining weights), one of our exports or `model.hf.save_checkpoint` folders, or a
    pre-training run's output folder (its `hf/`). Its shape and vocabulary decide the model's;
    heads it lacks start fresh. A restarted run resumes from its own `checkpoints/latest`
    instead (the checkpoint is then read for its shape only)."""
    num_hidden_layers: int = 0
    """Transformer blocks L (0 = the preset's)."""
    hidden_size: int = 0
    """Hidden width H (0 = the preset's); a multiple of num_attention_heads."""
    num_attention_heads: int = 0
    """Attention heads A (0 = the preset's)."""
    intermediate_size: int = 0
    """Feed-forward width (0 = the preset's; the presets use 4H)."""
    objective: str = "mlm"
    """What the run trains (training/objectives.py): mlm_nsp (masked LM + next sentence), mlm
    (masked LM, + NSP where next_sentence and the shards have NSP labels), ltr (the
    left-to-right LM baseline of Table 5, "LTR & No NSP"), or module:attribute naming an
    Objective defined elsewhere."""
    next_sentence: bool = True
    """Train the next-sentence head and loss where the shards have NSP labels; false: MLM-only
    (no NSP head or loss) on any shards (Table 5's "No NSP")."""
    vocab_dir: str = ""
    """Vocabulary folder (vocab.txt, tokenizer.json): special-token ids and the exported folder."""
    output_dir: str = "runs/pretrain"
    """Run folder: checkpoints/, tensorboard/, metrics.jsonl, config.json, loss_curve.png, hf/."""
    dropout: float = 0.1
    """Hidden and attention dropout of the model (0 makes runs comparable across rank counts)."""
    phases: tuple[PhaseConfig, ...] = (PhaseConfig(),)
    """The phases, run in order; each continues from the previous one's weights."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """DeepSpeed ZeRO stage 0-3 (bf16 and fp16 need >= 1, see LOW_PRECISION_ZERO0_MESSAGE)."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    """fp32, bf16 (CPU and GPU) or fp16 (GPU only, dynamic loss scaling); bf16/fp16 need
    zero_stage >= 1. auto: bf16 where the hardware multiplies in bf16 and the run allows it
    (ZeRO >= 1, AdamW), else fp32 (see `concrete_precision`)."""
    optimizer: Literal["adamw", "lamb"] = "adamw"
    """adamw, or lamb (large batches, GPU, ZeRO stage 0 only, so fp32)."""
    adam_beta1: float = 0.9
    """First-moment decay."""
    adam_beta2: float = 0.999
    """Second-moment decay."""
    adam_epsilon: float = 1e-6
    """Denominator epsilon (the paper's 1e-6, not PyTorch's 1e-8)."""
    weight_decay: float = 0.01
    """Decoupled weight decay; LayerNorm weights and all biases get none."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    seed: int = 12345
    """Seed of the model init, dropout, data order and re-masking."""
    dynamic_masking: bool = False
    """Re-draw the masks of every row each epoch instead of the shards' static masks."""
    masked_lm_prob: float = 0.0
    """Dynamic masking's share of each instance's tokens to predict, capped at the shards'
    max_predictions_per_seq (0 = as many per row as the shards' masks)."""
    shuffle_buffer: int = 2000
    """Rows in the loader's shuffle buffer (0 = no shuffling)."""
    num_workers: int = 1
    """DataLoader worker processes per rank (0 = in the training process)."""
    log_every: int = 10
    """Optimizer steps between metric lines (console, TensorBoard, metrics.jsonl)."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Experiment trackers that get the metrics, the config and loss_curve.png on rank 0:
    tensorboard, mlflow, wandb (comma-separated), or none (common/trackers.py)."""
    eval_every: int = 500
    """Optimizer steps between validation runs (0 = only at the end of each phase)."""
    eval_batches: int = 20
    """Micro-batches per rank per validation run."""
    checkpoint_every: int = 1000
    """Optimizer steps between checkpoints (0 = only at the end of each phase)."""
    probe_every: int = 0
    """Global optimizer steps (counted across phases) between probe exports: a checkpoint, then
    the consolidated fp32 Hugging Face folder of that step in <output_dir>/probes/step-NNNNNNN/hf
    (training/probes.py), which the flow's probes fine-tune while training goes on (0 = off)."""
    keep_checkpoints: int = 3
    """Checkpoints kept (the oldest are deleted after a new one is complete)."""
    export_hf: bool = True
    """Export a consolidated fp32 Hugging Face folder to <output_dir>/hf at the end."""
    device: Literal["auto", "cuda"] = "auto"
    """auto (CUDA GPUs when torch sees one, else CPU ranks over gloo) or cuda (GPUs required:
    where torch has no usable CUDA the run stops before any rank starts, see
    training/launch.py `refuse_cpu_fallback`, instead of training on the CPU)."""
    compile: bool = False
    """torch.compile on a GPU (fullgraph): with static shapes and ZeRO 0-2 the whole model,
    heads and losses as one graph (`model.bert.compile_model`), else each encoder layer
    (`compile_layers`; ZeRO-3 gathers parameters in module hooks); CPU runs stay eager, where
    compiling measured slower (benchmarks/RESULTS.md 4.0, 4.3)."""
    static_shapes: Literal["auto", "on", "off"] = "auto"
    """Pad every batch of a phase to one shape (`training.loader.StaticShapes`), so that the whole
    step compiles once (`compile`); auto: where the whole step compiles, a compiled GPU run
    below ZeRO-3 (`uses_static_shapes`)."""

    def __post_init__(self):
        settings.check_choices(self, "--set {setting}: {message}")
        self._check_objective()
        _check(self.model in MODEL_PRESETS or (self.model == "" and bool(self.init_from)),
               "model", f"one of {sorted(MODEL_PRESETS)} (or empty with init_from)")
        for flag in SHAPE_FIELDS:
            _check(getattr(self, flag) >= 0, flag, ">= 0 (0 = the preset's)")
        if self.model:  # with init_from and no preset the checkpoint's shape is checked at start
            shape = {**MODEL_PRESETS[self.model]().to_dict(),
                     **{f: getattr(self, f) for f in SHAPE_FIELDS if getattr(self, f)}}
            _check(shape["hidden_size"] % shape["num_attention_heads"] == 0, "hidden_size",
                   f"a multiple of num_attention_heads (got hidden_size={shape['hidden_size']}, "
                   f"num_attention_heads={shape['num_attention_heads']}, model={self.model})")
        self._check_masking()
        _check(len(self.phases) > 0, "phases", "at least one phase")
        _check(0 <= self.dropout < 1, "dropout", "in [0, 1)")
        names = [p.name for p in self.phases]
        _check(len(set(names)) == len(names), "phases", f"uniquely named, got {names}")
        _check(0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "adam_beta1/adam_beta2",
               "in [0, 1)")
        _check(self.adam_epsilon > 0, "adam_epsilon", "positive")
        _check(self.weight_decay >= 0, "weight_decay", ">= 0")
        _check(self.max_grad_norm >= 0, "max_grad_norm", ">= 0")
        _check(self.shuffle_buffer >= 0, "shuffle_buffer", ">= 0")
        _check(self.num_workers >= 0, "num_workers", ">= 0")
        _check(self.log_every > 0, "log_every", "positive")
        self._check_report_to()
        for flag in ("eval_every", "eval_batches", "checkpoint_every", "probe_every"):
            _check(getattr(self, flag) >= 0, flag, ">= 0")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", ">= 1")
        if self.optimizer == "lamb" and self.zero_stage >= 1:
            raise ValueError(LAMB_ZERO_MESSAGE.format(stage=self.zero_stage))
        if self.optimizer == "lamb" and self.precision not in ("fp32", "auto"):
            raise ValueError(LAMB_LOW_PRECISION_MESSAGE.format(precision=self.precision))
        if self.precision not in ("fp32", "auto") and self.zero_stage == 0:
            raise ValueError(LOW_PRECISION_ZERO0_MESSAGE.format(precision=self.precision))

    def concrete_precision(self, bf16_hardware: bool) -> str:
        """The precision the run trains in. `auto` picks bf16 only where it is both fast and
        allowed: on a CPU without bf16 matrix units (AVX2 only) oneDNN emulates bf16 products
        about 100x slower than fp32 ones, which makes a bf16 run tens of times slower there."""
        if self.precision != "auto":
            return self.precision
        allowed = self.zero_stage >= 1 and self.optimizer == "adamw"
        return "bf16" if bf16_hardware and allowed else "fp32"

    def uses_static_shapes(self, on_gpu: bool) -> bool:
        """Whether the loader pads every batch of a phase to one shape: `static_shapes`, with
        auto where the whole step compiles (`compiles_whole_model`). There a step is bound by launches and host time more than by FLOPs,
        and one shape lets the whole step compile once. A CPU run stays eager (compiling
        measured slower there), so padding buys it nothing and costs its compute: on the books'
        shards, eager fp32, bert_tiny 6% slower a step packed at 512 tokens (batch 8: 16
        instance and 92 masked slots for 1-3 and 76-77 used), bert_mini 1%, and no change at
        128 tokens, where those rows fill the row."""
        return self.static_shapes == "on" or (self.static_shapes == "auto"
                                               and self.compiles_whole_model(on_gpu))

    def compiles_whole_model(self, on_gpu: bool) -> bool:
        """Whether the step can be one compiled graph: compiled, on a GPU, and outside ZeRO-3,
        whose hooks gather each module's parameters inside the forward (per-layer graphs
        there). `static_shapes=auto` pads exactly where this holds."""
        return self.compile and on_gpu and self.zero_stage < 3

    def model_config(self, vocab_size: int, **changes: Any):
        """The `model.bert.BertConfig` of the preset with this run's shape and dropout (the
        objective sets the attention it asks for, `Objective.build_model`)."""
        from model.bert import BertConfig
        shape = {f: getattr(self, f) for f in SHAPE_FIELDS if getattr(self, f)}
        base = MODEL_PRESETS[self.model]().to_dict()
        return BertConfig(**{**base, **shape, "vocab_size": vocab_size,
                             "hidden_dropout_prob": self.dropout,
                             "attention_probs_dropout_prob": self.dropout, **changes})

    def masking(self, max_predictions_per_seq: int) -> MaskingConfig:
        """Dynamic masking's `common.masking.MaskingConfig`, capped as the shards are."""
        split = {f.name: getattr(self, f.name) for f in dataclasses.fields(MaskSplit)}
        return MaskingConfig(masked_lm_prob=self.masked_lm_prob or 0.15,
                             max_predictions_per_seq=max_predictions_per_seq, **split)

    def _check_masking(self) -> None:
        _check(0 <= self.masked_lm_prob < 1, "masked_lm_prob", "in [0, 1) (0 = the shards' count)")
        try:
            self.check_split()
        except SettingError as e:
            raise SettingError(e.setting, e.message, "--set {setting}: {message}") from None
        changed = [f for f in MASKING_FIELDS
                   if getattr(self, f) != PretrainConfig.__dataclass_fields__[f].default]
        if changed and not self.dynamic_masking:
            raise SettingError(changed[0], "acts only with dynamic_masking=true (without it the "
                               "shards' masks are used: set it in make_shards instead)",
                               "--set {setting}: {message}")

    def _check_report_to(self) -> None:
        from common.trackers import check_names
        # a config file's or config.json's list, given as it is read (`from_dict`)
        object.__setattr__(self, "report_to", tuple(self.report_to))
        try:
            check_names(self.report_to)
        except SettingError as e:
            raise SettingError(e.setting, e.message, "--set {setting}: {message}") from None

    def _check_objective(self) -> None:
        from training import objectives
        try:
            objective = objectives.get(self.objective)
        except ValueError as e:
            raise SettingError("objective", str(e), "--set {setting}: {message}") from None
        objective.check(self)

    def phase(self, name: str) -> PhaseConfig:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase named {name!r} (phases: {[p.name for p in self.phases]})")


LAMB_ZERO_MESSAGE = (
    "optimizer=lamb cannot be combined with zero_stage={stage}: ZeRO partitions parameters "
    "across ranks, so LAMB's per-layer trust ratio ||w|| / ||update|| would be computed on "
    "partitions instead of whole layers. Use optimizer=adamw with ZeRO, or lamb with zero_stage=0."
)
# DeepSpeed 0.19.8 (runtime/engine.py `_do_optimizer_sanity_check`, `_configure_fp16_optimizer`):
# a stage-0 bf16 FusedLamb goes into FP16_UnfusedOptimizer (`fused_lamb_legacy`), whose fp32
# masters are private to the wrapper; at stage 1-2 FusedLamb is not a ZeRO-supported optimizer
# and its trust ratio would be taken over flat partitions.
LAMB_LOW_PRECISION_MESSAGE = (
    "optimizer=lamb cannot be combined with precision={precision}: DeepSpeed 0.19 runs a "
    "{precision} LAMB only at zero_stage=0, inside its FP16 optimizer wrapper, whose fp32 master "
    "weights no checkpoint or export reads (they would be {precision}-rounded), and with ZeRO "
    "LAMB's per-layer trust ratio would be computed on flat partitions. Use precision=fp32 with "
    "lamb (matrix products run in TF32 on the GPU), or optimizer=adamw with bf16."
)
# Why: at stage 0 DeepSpeed 0.19 wraps the optimizer in its FP16 optimizer, whose fp32 master
# weights live only in that wrapper's private optimizer state; the checkpoint's "module" (what
# every export reads) holds the bf16/fp16-rounded copy. ZeRO 1-3 keep the masters in the
# optimizer-state files that DeepSpeed's own zero_to_fp32 consolidates (it supports stages 1-3
# only), and ZeRO-1 on one rank costs nothing.
LOW_PRECISION_ZERO0_MESSAGE = (
    "precision={precision} cannot be combined with zero_stage=0: DeepSpeed keeps the fp32 master "
    "weights of a stage-0 {precision} run only inside its FP16 optimizer wrapper, so checkpoints, "
    "the consolidated export and phase 2's starting weights would be {precision}-rounded. Use "
    "zero_stage=1 (same memory on one rank; fp32 masters partitioned over ranks), or "
    "precision=fp32."
)


# ---------------------------------------------------------------- presets

def _paper_phases(train_128: str = "", train_512: str = "", total_steps: int = 1_000_000,
                  global_batch_size: int = 256, micro_128: int = 32, micro_512: int = 32,
                  learning_rate: float = 1e-4, warmup_steps: int = 10_000) -> tuple:
    """The paper's two phases: 90% of the steps at 128 tokens, then 10% at 512 tokens."""
    steps_1 = total_steps * 9 // 10
    steps_2 = total_steps - steps_1
    return (
        PhaseConfig(name="phase1", train_shards=train_128, max_seq_length=128,
                    micro_batch_size=micro_128, global_batch_size=global_batch_size,
                    steps=steps_1, warmup_steps=min(warmup_steps, steps_1),
                    learning_rate=learning_rate),
        PhaseConfig(name="phase2", train_shards=train_512, max_seq_length=512,
                    micro_batch_size=micro_512, global_batch_size=global_batch_size,
                    steps=steps_2, warmup_steps=min(warmup_steps, steps_2),
                    learning_rate=learning_rate),
    )


def tiny() -> PretrainConfig:
    """bert_tiny on CPU for tests and the demo: 600 steps at 128 tokens, 60 at 256 (the tiny
    shards' phase-2 length, pipelines/shards/batches.py), phase 2's warmup a tenth of its steps."""
    phases = (
        PhaseConfig(name="phase1", max_seq_length=128, micro_batch_size=32, global_batch_size=32,
                    steps=600, warmup_steps=60, learning_rate=1e-3),
        PhaseConfig(name="phase2", max_seq_length=256, micro_batch_size=16, global_batch_size=16,
                    steps=60, warmup_steps=6, learning_rate=1e-3),
    )
    return PretrainConfig(model="bert_tiny", phases=phases, zero_stage=1, precision="auto",
                          log_every=10, eval_every=100, eval_batches=5, checkpoint_every=100,
                          shuffle_buffer=500)


# GPU micro-batches, from training/memory.py's estimate for one rank of 8 (bf16, ZeRO-1) on an
# 80 GB GPU: model states (bf16 weights and gradients, 16 bytes/parameter of fp32 masters, Adam
# moments and fp32 gradients over 8 ranks) + 3 GiB workspace + activations per row (34 H bytes
# per token and layer with flash attention, plus embeddings and the MLM logits):
#
#   model       states    per row @128 / @512    micro 32 @128 / @512    most rows in 80 GB
#   BERT-base   0.62 GiB   42 / 169 MiB          4.9 / 8.9 GiB           1538 / 384
#   BERT-large  1.88 GiB  106 / 424 MiB          8.2 / 18.1 GiB           599 / 149
#
# So memory does not bind: the global batch does. 256 rows over 8 ranks is 32 rows per rank, in
# both phases: one micro-batch per step, no accumulation (each accumulation step would repeat the
# per-micro-batch costs: launches, the gradient reduction, the optimizer's reads). On fewer GPUs
# the same micro-batch accumulates (1 GPU: 8 steps), or may grow up to the last column.
#
# Rows are packed (the flow's `shards.pack`): attention runs per instance (model/attention.py),
# so a packed row costs what a padded one does and carries 1.15 instances at 512 tokens
# (14.2% padding unpacked, 0.9% packed, benchmarks/RESULTS.md 4.0a); at 128 tokens packing
# removes the padding there is and costs nothing. `compile`: fused layers on the GPU.

def base() -> PretrainConfig:
    """BERT-base as in the paper: 1M steps at batch 256, lr 1e-4, 10k warmup."""
    return PretrainConfig(model="bert_base", phases=_paper_phases(), precision="bf16",
                          zero_stage=2, device="cuda", compile=True, log_every=100,
                          eval_every=10_000, checkpoint_every=5_000)


def large() -> PretrainConfig:
    """BERT-large as in the paper: 1M steps at batch 256, lr 1e-4, 10k warmup."""
    return PretrainConfig(model="bert_large", phases=_paper_phases(), precision="bf16",
                          zero_stage=2, device="cuda", compile=True, log_every=100,
                          eval_every=10_000, checkpoint_every=5_000)


PRESETS = {"tiny": tiny, "base": base, "large": large}


# ---------------------------------------------------------------- overrides

def to_dict(config: PretrainConfig) -> dict:
    """A JSON-able dict of the config (phases as a list)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def from_dict(data: Mapping[str, Any], base: PretrainConfig | None = None,
              user_file: bool = False) -> PretrainConfig:
    """Apply a nested mapping (a YAML/JSON file's content) on top of `base`; validated once.
    `user_file`: a user's config file, told when its phases leave some of `base`'s out."""
    merged = to_dict(base or PretrainConfig())
    for key, value in data.items():
        if key != "phases":
            _assign(merged, PretrainConfig, key, value, key, origin="config key")
            continue
        merged["phases"] = _merge_phases(merged["phases"], value, warn=user_file)
    return _build(merged)


def _merge_phases(base: list[dict], entries: Any, warn: bool) -> list[dict]:
    """A file's `phases` list is the run's phases, in its order. An entry with a `name` starts
    from the base phase of that name (so `{name: phase2, steps: 10}` keeps phase 2's length
    and learning rate), an unnamed one from the base phase at its position; phases of the base
    the list leaves out are not run, and a warning says so."""
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise ValueError("config key 'phases' must be a list of phase mappings")
    by_name = {phase["name"]: phase for phase in base}
    phases = []
    for i, entry in enumerate(entries):
        if "name" in entry:
            phase = dict(by_name.get(str(entry["name"]), dataclasses.asdict(PhaseConfig())))
        else:
            phase = dict(base[i]) if i < len(base) else dataclasses.asdict(PhaseConfig())
        given: dict[str, Any] = {}
        for name, v in entry.items():
            _assign(given, PhaseConfig, name, v, f"phases.{i}.{name}", origin="config key")
        phases.append({**phase, **PhaseConfig(**phase).follow_changes(given)})
    dropped = [name for name in by_name if name not in {p["name"] for p in phases}]
    if dropped and warn:
        log.warning("the config file's phases %s leave out the preset's %s: not run",
                    [p["name"] for p in phases], dropped)
    return phases


def load_file(path: str, base: PretrainConfig | None = None) -> PretrainConfig:
    """Overrides from a `.yaml`/`.yml`/`.json` file."""
    data = settings.load_file(path)
    try:
        return from_dict(data, base, user_file=True)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e


def apply_overrides(config: PretrainConfig, assignments: Sequence[str]) -> PretrainConfig:
    """Apply `key=value` strings (see the module docstring); validated after all of them, so
    their order does not matter (`phase1.steps=3` before `phase1.warmup_steps=1` is fine)."""
    return settings.apply(config, settings.parse_assignments(assignments), label="--set")


def _assign(target: dict, cls: type, name: str, raw: Any, flag: str,
            origin: str = "--set") -> None:
    """target[name] = `raw` as the field's type, after checking that `cls` has that field.
    Errors name `origin` and `flag` ("--set phases.0.steps", "config key phases.0.steps")."""
    fields = {f.name for f in dataclasses.fields(cls)} - {"phases"}
    if name not in fields:
        raise ValueError(f"{origin} {flag}: unknown field (known: {sorted(fields)})")
    target[name] = convert_setting(f"{origin} {flag}", raw, typing.get_type_hints(cls)[name])


def _build(data: dict) -> PretrainConfig:
    """The validated config of a to_dict-shaped mapping; phase errors name the phase."""
    phases = []
    for i, raw in enumerate(data["phases"]):
        try:
            phases.append(PhaseConfig(**raw))
        except SettingError as e:
            raise e.within(f"phases.{i}.", e.template) from None
    return PretrainConfig(**{**data, "phases": tuple(phases)})


def resolve(preset: str = "tiny", config_file: str | None = None,
            assignments: Sequence[str] = ()) -> PretrainConfig:
    """Preset, then file, then `--set` overrides."""
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r}: expected one of {sorted(PRESETS)}")
    config = PRESETS[preset]()
    given = {**(settings.load_file(config_file) if config_file else {}),
             **settings.parse_assignments(assignments)}
    shape = checkpoint_decides_shape(given)
    if shape:
        config = settings.apply(config, {**shape, "init_from": given["init_from"]}, label="--set")
    if config_file:
        config = load_file(config_file, config)
    return apply_overrides(config, assignments)


def checkpoint_decides_shape(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`{"model": ""}` where `overrides` (of a PretrainConfig) name `init_from` and not `model`:
    the checkpoint then decides the shape (training/init_from.py), not the preset's model. The
    caller applies it with the overrides, before validation, so that a shape setting beside
    `init_from` is checked against the checkpoint, not the preset (`bert-pretrain --set` and the
    flow's `pretrain.*` alike)."""
    return {"model": ""} if overrides.get("init_from") and "model" not in overrides else {}


def save(config: PretrainConfig, path: str) -> None:
    from common import storage
    storage.atomic_write_json(path, to_dict(config))


def load_saved(path: str) -> PretrainConfig:
    """The config saved with a run or checkpoint (config.json)."""
    with open(path, encoding="utf-8") as f:
        return from_dict(json.load(f))


# Fields a resumed run may change: where things are, how often to log/evaluate/save, and speed or
# memory knobs. (micro_batch_size: the global batch fixes the optimisation; the loader then
# resumes at the same share of the epoch. Shard locations: their content is compared instead.)
RESUME_FREE_FIELDS = ("output_dir", "vocab_dir", "num_workers", "compile", "static_shapes",
                      "log_every", "eval_every", "eval_batches", "checkpoint_every", "probe_every",
                      "keep_checkpoints",
                      "export_hf", "device", "report_to",
                      "phases.*.train_shards", "phases.*.validation_shards",
                      "phases.*.micro_batch_size")


def resume_conflicts(saved: PretrainConfig, current: PretrainConfig) -> list[str]:
    """`field: saved -> current` for every field outside RESUME_FREE_FIELDS that differs."""
    old, new = to_dict(saved), to_dict(current)
    free = set(RESUME_FREE_FIELDS)
    conflicts = [f"{key}: {old[key]!r} -> {new[key]!r}" for key in old
                 if key != "phases" and key not in free and old[key] != new.get(key)]
    if len(old["phases"]) != len(new["phases"]):
        conflicts.append(f"phases: {[p['name'] for p in old['phases']]} -> "
                         f"{[p['name'] for p in new['phases']]}")
    for i, (a, b) in enumerate(zip(old["phases"], new["phases"])):
        conflicts += [f"phases.{i}.{key}: {a[key]!r} -> {b[key]!r}" for key in a
                      if f"phases.*.{key}" not in free and a[key] != b[key]]
    return conflicts


def describe(config: PretrainConfig, world_size: int = 1) -> str:
    """The resolved config as printed at start (YAML, with each phase's derived accumulation)."""
    data = to_dict(config)
    for phase, raw in zip(config.phases, data["phases"]):
        raw["gradient_accumulation_steps (derived)"] = phase.gradient_accumulation_steps(world_size)
    data["world_size"] = world_size
    data["rank_env"] = {k: os.environ.get(k, "") for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return yaml.safe_dump(data, sort_keys=False)

