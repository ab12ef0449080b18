"""Typed configuration of a pre-training run: presets, file/CLI overrides, validation.

A run is a sequence of phases (the paper, section A.2: 90% of the steps at 128 tokens, then 10%
at 512 tokens). Each phase has its own shards, batch and learning-rate schedule; phase 2 starts
from phase 1's weights with a fresh optimizer and schedule.

`PretrainConfig` is made of sections, each a small frozen dataclass (torchtitan's `JobConfig`):
`model` (the encoder: preset, shape, dropout, `init_from`; `ModelConfig.build` is where a run's
`model.bert.BertConfig` is made), `objective`, `optimizer` (its AdamW fields are
common/optimizer.py's, shared with fine-tuning), `engine` (precision and parallelism), `data`
(vocabulary, dynamic masking, loader), `cadence` (logging, evaluation, checkpoints, export),
`phases`, and at the top level `output_dir` and `seed`. A check within one section names its
field there; the checks across sections (LAMB with ZeRO, low precision with ZeRO 0, the
objective's own) are `PretrainConfig`'s and name the settings by their dotted names.

Overrides, applied in order after the preset:
- `--config run.yaml` (or `.json`): a nested mapping (`engine: {zero_stage: 2}`); `phases` a
  list, the run's phases, each merged into the preset's phase of its name (`_merge_phases`).
- `--set key=value` (repeatable): dotted keys, `engine.zero_stage=2`, `phases.0.steps=300` or
  by phase name, `phase1.learning_rate=5e-4`. Both go through `common.settings.apply`, the
  mechanism the flow's `--set` uses too, which converts each value to its field's type (`1e-4`
  a float, `true`/`false` a bool, text as given).

A flat name of the sections' fields (`zero_stage`, `model=bert_base`) fails naming its dotted
one (`RENAMED_SETTINGS`, which the flow's `pretrain.*` settings use as well); a run's own saved
`config.json` in the flat layout loads as its sections (`load_saved`), so such runs resume.

A phase shortened without its `warmup_steps` keeps the preset's warmup share (tiny:
`phase1.steps=30` -> warmup 60 x 30/600 = 3, logged); a warmup set beside it is kept, and one
longer than the phase is an error naming the setting as written, with both values.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import yaml

from common import settings
from common.masking import MaskingConfig, MaskSplit
from common.optimizer import AdamWOptions
from common.settings import SettingError
from model.encoders import ENCODERS, arch_of_preset
from model.encoders import PRESETS as MODEL_PRESETS

if TYPE_CHECKING:
    from model.encoders import EncoderConfig

log = logging.getLogger(__name__)

SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
"""`model` settings that override the preset's shape (0 = the preset's value)."""
MASKING_FIELDS = ("dynamic_masked_lm_prob", "dynamic_masked_lm_prob_end",
                  *(f.name for f in dataclasses.fields(MaskSplit)))
"""`data` settings of dynamic masking (`data.dynamic_masking=true`)."""


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
    to 0 at `steps` (training/optim.py `LinearWarmupDecay`; `optimizer.schedule=wsd`: the peak
    held, then `decay_steps`). Left unset while `steps` is shortened, it shrinks in proportion
    (`PhaseConfig.follow_changes`)."""
    decay_steps: int = 0
    """`optimizer.schedule=wsd` only: the phase's last steps, in which the learning rate falls
    from the peak to 0 (`optimizer.decay_shape`); 0 = the phase ends at the peak, a stable phase
    whose checkpoints a later run decays from."""
    learning_rate: float = 1e-4
    """Peak learning rate."""
    batch_warmup_rows: int = 0
    """Global batch at the phase's first step, growing linearly with the tokens trained to
    `global_batch_size` after `batch_warmup_tokens` (ModernBERT: 768 -> 4,608 rows over its
    first 50B tokens); each step's batch is whole micro-batches on every rank. 0 = the full
    batch from the first step."""
    batch_warmup_tokens: int = 0
    """Tokens (rows x max_seq_length) over which the batch grows from `batch_warmup_rows`."""
    rope_theta: float = 0.0
    """Rotary encoders (modernbert): the global layers' RoPE base in this phase (0 = the
    model's). Context extension raises it with the length, as ModernBERT went from 10,000 at
    1,024 tokens to 160,000 at 8,192; the local layers keep theirs."""

    def __post_init__(self):
        _check(bool(self.name) and "/" not in self.name, "name", "a non-empty name without '/'")
        _check(self.rope_theta >= 0, "rope_theta", ">= 0 (0 = the model's)")
        _check(0 <= self.batch_warmup_rows <= self.global_batch_size
               and self.batch_warmup_rows % self.micro_batch_size == 0, "batch_warmup_rows",
               f"a multiple of micro_batch_size={self.micro_batch_size} in [0, "
               f"global_batch_size={self.global_batch_size}], got {self.batch_warmup_rows}")
        _check(self.batch_warmup_tokens >= 0 and
               bool(self.batch_warmup_tokens) == bool(self.batch_warmup_rows),
               "batch_warmup_tokens", "> 0 with batch_warmup_rows (and 0 without)")
        for flag in ("max_seq_length", "micro_batch_size", "global_batch_size", "steps"):
            _check(getattr(self, flag) > 0, flag, "positive")
        _check(0 <= self.warmup_steps <= self.steps, "warmup_steps",
               f"in [0, steps={self.steps}], got {self.warmup_steps}")
        _check(0 <= self.decay_steps <= self.steps - self.warmup_steps, "decay_steps",
               f"in [0, steps - warmup_steps = {self.steps - self.warmup_steps}], got "
               f"{self.decay_steps}")
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
class ModelConfig:
    """The encoder: an architecture and a preset's shape, changed by the shape fields, and its
    dropout; or a checkpoint's (`init_from`)."""
    arch: str = ""
    """Encoder architecture (model/encoders.py): bert (Devlin et al. 2019) or modernbert
    (RoPE, GeGLU, pre-LN, local and global attention; Warner et al. 2024). "" = the preset's.
    Another arch than the preset's takes that arch's preset of the same size (bert_tiny ->
    modernbert_tiny)."""
    preset: str = "bert_tiny"
    """Model preset (bert_tiny, bert_mini, bert_base, bert_large, modernbert_tiny,
    modernbert_base, modernbert_large); the shape fields below override its shape (paper
    Table 6). "" with `init_from`: the checkpoint's shape (what `--set model.init_from=...` alone
    resolves to); a preset or shape field named together with `init_from` must agree with the
    checkpoint."""
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
    """Feed-forward width (0 = the preset's; BERT's presets use 4H, ModernBERT's GeGLU
    projects to twice this width)."""
    max_position_embeddings: int = 0
    """Longest row the model takes (0 = the preset's: BERT 512 learned positions, ModernBERT
    8,192 rotary ones)."""
    dropout: float = 0.1
    """BERT: hidden and attention dropout (0 makes runs comparable across rank counts).
    ModernBERT: the dropout before a fine-tuning classifier; it pre-trains without dropout,
    as published."""

    def __post_init__(self):
        _check(self.arch in ("", *ENCODERS), "arch", f"one of {sorted(ENCODERS)} (or empty)")
        if self.arch and self.preset in MODEL_PRESETS and arch_of_preset(self.preset) != self.arch:
            size = self.preset.rpartition("_")[2]
            _check(f"{self.arch}_{size}" in MODEL_PRESETS, "arch",
                   f"an arch with a {size} preset (preset={self.preset})")
            object.__setattr__(self, "preset", f"{self.arch}_{size}")  # the arch's own preset
        _check(self.preset in MODEL_PRESETS or (self.preset == "" and bool(self.init_from)),
               "preset", f"one of {sorted(MODEL_PRESETS)} (or empty with init_from)")
        for flag in SHAPE_FIELDS:
            _check(getattr(self, flag) >= 0, flag, ">= 0 (0 = the preset's)")
        if self.preset:  # with init_from and no preset the checkpoint's shape is checked at start
            shape = {**MODEL_PRESETS[self.preset]().to_dict(), **self.shape()}
            _check(shape["hidden_size"] % shape["num_attention_heads"] == 0, "hidden_size",
                   f"a multiple of num_attention_heads (got hidden_size={shape['hidden_size']}, "
                   f"num_attention_heads={shape['num_attention_heads']}, "
                   f"preset={self.preset})")
        _check(0 <= self.dropout < 1, "dropout", "in [0, 1)")

    def shape(self) -> dict[str, int]:
        """The shape fields set (non-zero)."""
        return {f: getattr(self, f) for f in SHAPE_FIELDS if getattr(self, f)}

    def build(self, vocab_size: int, base: EncoderConfig | None = None,
              **changes: Any) -> EncoderConfig:
        """The run's encoder config, of the preset's arch (`model.bert.BertConfig`,
        `model.modernbert.ModernBertConfig`): `base` (a checkpoint's, training/init_from.py) or
        the preset's, with this section's shape fields and dropout (BERT's two dropouts;
        ModernBERT's classifier dropout alone, it pre-trains without), `vocab_size`, then
        `changes` (`vocab_multiple`), each of which the config must have."""
        start = base if base is not None else MODEL_PRESETS[self.preset]()
        names = {f.name for f in dataclasses.fields(start)}
        if unknown := sorted(set(changes) - names):
            raise TypeError(f"{type(start).__name__} has no {', '.join(unknown)}")
        dropouts = {name: self.dropout for name in ("hidden_dropout_prob",
                                                    "attention_probs_dropout_prob")
                    if name in names}
        return start.replace(**self.shape(), vocab_size=vocab_size, **dropouts, **changes)


@dataclass(frozen=True)
class ObjectiveConfig:
    """What the run trains (training/objectives.py)."""
    name: str = "mlm"
    """mlm_nsp (masked LM + next sentence), mlm (masked LM, + NSP where next_sentence and the
    shards have NSP labels), ltr (the left-to-right LM baseline of Table 5, "LTR & No NSP"), or
    module:attribute naming an Objective defined elsewhere."""
    next_sentence: bool = True
    """Train the next-sentence head and loss where the shards have NSP labels; false: MLM-only
    (no NSP head or loss) on any shards (Table 5's "No NSP")."""

    def __post_init__(self):
        from training import objectives
        try:
            objectives.get(self.name)
        except ValueError as e:
            raise SettingError("name", str(e), "--set {setting}: {message}") from None


@dataclass(frozen=True)
class OptimizerConfig(AdamWOptions):
    """The optimizer; `weight_decay`, `adam_epsilon` and `max_grad_norm` are fine-tuning's
    too (common/optimizer.py)."""
    name: Literal["adamw", "lamb"] = "adamw"
    """adamw, or lamb (large batches, GPU, engine.zero_stage 0 only, so fp32)."""
    adam_beta1: float = 0.9
    """First-moment decay."""
    adam_beta2: float = 0.999
    """Second-moment decay."""
    schedule: Literal["linear", "wsd"] = "linear"
    """Learning-rate schedule of each phase (training/optim.py): linear (BERT: warmup, then a
    linear decay to 0 at the phase's end) or wsd (warmup-stable-decay, as ModernBERT trains:
    warmup, the peak held, then a decay over the phase's `decay_steps`)."""
    decay_shape: Literal["linear", "1-sqrt", "cosine"] = "1-sqrt"
    """wsd's decay from the peak to 0: linear, 1-sqrt (1 - sqrt(progress)) or cosine."""

    def __post_init__(self):
        settings.check_choices(self, "--set {setting}: {message}")
        self.check_adamw()
        for flag in ("adam_beta1", "adam_beta2"):
            _check(0 <= getattr(self, flag) < 1, flag, "in [0, 1)")


@dataclass(frozen=True)
class EngineConfig:
    """Precision and parallelism: how DeepSpeed and torch run the step."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """DeepSpeed ZeRO stage 0-3 (bf16 and fp16 need >= 1, see LOW_PRECISION_ZERO0_MESSAGE)."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    """fp32, bf16 (CPU and GPU) or fp16 (GPU only, dynamic loss scaling); bf16/fp16 need
    zero_stage >= 1. auto: bf16 where the hardware multiplies in bf16 and the run allows it
    (ZeRO >= 1, AdamW), else fp32 (see `PretrainConfig.concrete_precision`)."""
    device: Literal["auto", "cuda"] = "auto"
    """auto (CUDA GPUs when torch sees one, else CPU ranks over gloo) or cuda (GPUs required:
    where torch has no usable CUDA the run stops before any rank starts, see
    training/launch.py `refuse_cpu_fallback`, instead of training on the CPU)."""
    compile: bool = False
    """torch.compile on a GPU (fullgraph): with static shapes and ZeRO 0-2 the whole model,
    heads and losses as one graph (`model.compiling.compile_model`), else each encoder layer
    (`compile_layers`; ZeRO-3 gathers parameters in module hooks); CPU runs stay eager, where
    compiling measured slower (benchmarks/RESULTS.md 4.0, 4.3)."""
    static_shapes: Literal["auto", "on", "off"] = "auto"
    """Pad every batch of a phase to one shape (`training.batching.StaticShapes`), so that the whole
    step compiles once (`compile`); auto: where the whole step compiles, a compiled GPU run
    below ZeRO-3 (`uses_static_shapes`)."""

    def __post_init__(self):
        settings.check_choices(self, "--set {setting}: {message}")

    def uses_static_shapes(self, on_gpu: bool) -> bool:
        """Whether the loader pads every batch of a phase to one shape: `static_shapes`, with
        auto where the whole step compiles (`compiles_whole_model`). There a step is bound by
        launches and host time more than by FLOPs, and one shape lets the whole step compile
        once. A CPU run stays eager (compiling measured slower there), so padding buys it
        nothing and costs its compute: on the books' shards, eager fp32, bert_tiny 6% slower a
        step packed at 512 tokens (batch 8: 16 instance and 92 masked slots for 1-3 and 76-77
        used), bert_mini 1%, and no change at 128 tokens, where those rows fill the row."""
        return self.static_shapes == "on" or (self.static_shapes == "auto"
                                               and self.compiles_whole_model(on_gpu))

    def compiles_whole_model(self, on_gpu: bool) -> bool:
        """Whether the step can be one compiled graph: compiled, on a GPU, and outside ZeRO-3,
        whose hooks gather each module's parameters inside the forward (per-layer graphs
        there). `static_shapes=auto` pads exactly where this holds."""
        return self.compile and on_gpu and self.zero_stage < 3


@dataclass(frozen=True)
class PretrainDataConfig(MaskSplit):
    """The vocabulary, dynamic masking and the loader. The MASK/SAME/RND split and
    `do_whole_word_mask` (from `common.masking.MaskSplit`) act with `dynamic_masking=true`
    only."""
    vocab_dir: str = ""
    """Vocabulary folder (vocab.txt, tokenizer.json): special-token ids and the exported folder."""
    dynamic_masking: bool = False
    """Re-draw the masks of every row each epoch instead of the shards' static masks."""
    dynamic_masked_lm_prob: float = 0.0
    """Dynamic masking's share of each instance's tokens to predict, capped at the shards'
    max_predictions_per_seq (0 = as many per row as the shards' masks, which make_shards'
    masked_lm_prob drew)."""
    dynamic_masked_lm_prob_end: float = 0.0
    """A masking-rate schedule: the share at each phase's last step, reached linearly from
    `dynamic_masked_lm_prob` at its first (mmBERT 0.30 -> 0.05); the rate in force is logged
    each step as `mask_rate`. 0 = a fixed share."""
    shuffle_buffer: int = 2000
    """Rows in the loader's shuffle buffer (0 = no shuffling)."""
    num_workers: int = 1
    """DataLoader worker processes per rank (0 = in the training process)."""

    def __post_init__(self):
        self._check_masking()
        _check(self.shuffle_buffer >= 0, "shuffle_buffer", ">= 0")
        _check(self.num_workers >= 0, "num_workers", ">= 0")

    def masking(self, max_predictions_per_seq: int) -> MaskingConfig:
        """Dynamic masking's `common.masking.MaskingConfig`, capped as the shards are."""
        split = {f.name: getattr(self, f.name) for f in dataclasses.fields(MaskSplit)}
        return MaskingConfig(masked_lm_prob=self.dynamic_masked_lm_prob or 0.15,
                             max_predictions_per_seq=max_predictions_per_seq, **split)

    def _check_masking(self) -> None:
        _check(0 <= self.dynamic_masked_lm_prob < 1, "dynamic_masked_lm_prob",
               "in [0, 1) (0 = the shards' count)")
        _check(0 <= self.dynamic_masked_lm_prob_end < 1, "dynamic_masked_lm_prob_end",
               "in [0, 1) (0 = a fixed share)")
        _check(not self.dynamic_masked_lm_prob_end or self.dynamic_masked_lm_prob > 0,
               "dynamic_masked_lm_prob_end", "set with dynamic_masked_lm_prob (the share at the "
               "phase's first step)")
        try:
            self.check_split()
        except SettingError as e:
            raise SettingError(e.setting, e.message, "--set {setting}: {message}") from None
        defaults = PretrainDataConfig.__dataclass_fields__
        changed = [f for f in MASKING_FIELDS if getattr(self, f) != defaults[f].default]
        if changed and not self.dynamic_masking:
            raise SettingError(changed[0], "acts only with data.dynamic_masking=true (without "
                               "it the shards' masks are used: set it in make_shards instead)",
                               "--set {setting}: {message}")


@dataclass(frozen=True)
class CadenceConfig:
    """How often the run logs, evaluates and saves, and what it keeps."""
    log_every: int = 10
    """Optimizer steps between metric lines (console, TensorBoard, metrics.jsonl)."""
    eval_every: int = 500
    """Optimizer steps between validation runs (0 = only at the end of each phase)."""
    eval_batches: int = 20
    """Micro-batches per rank per validation run."""
    checkpoint_every: int = 1000
    """Optimizer steps between checkpoints (0 = only at the end of each phase)."""
    keep_checkpoints: int = 3
    """Checkpoints kept (the oldest are deleted after a new one is complete)."""
    export_hf: bool = True
    """Export a consolidated fp32 Hugging Face folder to <output_dir>/hf at the end."""
    probe_every: int = 0
    """Global optimizer steps (counted across phases) between probe exports: a checkpoint, then
    the consolidated fp32 Hugging Face folder of that step in <output_dir>/probes/step-NNNNNNN/hf
    (training/probes.py), which the flow's probes fine-tune while training goes on (0 = off)."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Experiment trackers that get the metrics, the config and loss_curve.png on rank 0:
    tensorboard, mlflow, wandb (comma-separated), or none (training/trackers.py)."""

    def __post_init__(self):
        _check(self.log_every > 0, "log_every", "positive")
        for flag in ("eval_every", "eval_batches", "checkpoint_every", "probe_every"):
            _check(getattr(self, flag) >= 0, flag, ">= 0")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", ">= 1")
        self._check_report_to()

    def _check_report_to(self) -> None:
        from training.trackers import check_names
        # a config file's or config.json's list, given as it is read (`from_dict`)
        object.__setattr__(self, "report_to", tuple(self.report_to))
        check_names(self.report_to)


@dataclass(frozen=True)
class PretrainConfig:
    """A whole pre-training run: its sections, phases, output folder and seed."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The encoder (`--set model.preset=bert_base`)."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """What the run trains."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer and its settings."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Precision and parallelism."""
    data: PretrainDataConfig = field(default_factory=PretrainDataConfig)
    """Vocabulary, dynamic masking and the loader."""
    cadence: CadenceConfig = field(default_factory=CadenceConfig)
    """Logging, evaluation, checkpoints and the export."""
    phases: tuple[PhaseConfig, ...] = (PhaseConfig(),)
    """The phases, run in order; each continues from the previous one's weights."""
    output_dir: str = "runs/pretrain"
    """Run folder: checkpoints/, tensorboard/, metrics.jsonl, config.json, loss_curve.png, hf/."""
    seed: int = 12345
    """Seed of the model init, dropout, data order and re-masking."""

    def __post_init__(self):
        _check(len(self.phases) > 0, "phases", "at least one phase")
        names = [p.name for p in self.phases]
        _check(len(set(names)) == len(names), "phases", f"uniquely named, got {names}")
        from training import objectives
        objectives.get(self.objective.name).check(self)
        optimizer, zero, precision = self.optimizer.name, self.engine.zero_stage, \
            self.engine.precision
        if optimizer == "lamb" and zero >= 1:
            raise ValueError(LAMB_ZERO_MESSAGE.format(stage=zero))
        if optimizer == "lamb" and precision not in ("fp32", "auto"):
            raise ValueError(LAMB_LOW_PRECISION_MESSAGE.format(precision=precision))
        if precision not in ("fp32", "auto") and zero == 0:
            raise ValueError(LOW_PRECISION_ZERO0_MESSAGE.format(precision=precision))
        rotary = not self.model.preset or hasattr(MODEL_PRESETS[self.model.preset](),
                                                  "global_rope_theta")
        for phase in self.phases:  # init_from's encoder is checked when its phase starts
            if phase.decay_steps and self.optimizer.schedule != "wsd":
                # the linear schedule decays over the whole phase: the steps would be ignored
                raise SettingError(f"{phase.name}.decay_steps", "needs optimizer.schedule=wsd "
                                   f"(the {self.optimizer.schedule} schedule decays over the "
                                   f"whole phase), got {phase.decay_steps}",
                                   "--set {setting}: {message}")
            if phase.batch_warmup_rows and self.data.dynamic_masked_lm_prob_end:
                raise SettingError("data.dynamic_masked_lm_prob_end", "a masking-rate schedule "
                                   f"runs with a fixed batch; {phase.name}.batch_warmup_rows "
                                   "changes it", "--set {setting}: {message}")
            if phase.rope_theta and not rotary:
                raise SettingError(f"{phase.name}.rope_theta", f"the {self.model.preset} "
                                   "encoder has no rotary positions (model.arch=modernbert has)",
                                   "--set {setting}: {message}")

    def concrete_precision(self, bf16_hardware: bool) -> str:
        """The precision the run trains in. `auto` picks bf16 only where it is both fast and
        allowed: on a CPU without bf16 matrix units (AVX2 only) oneDNN emulates bf16 products
        about 100x slower than fp32 ones, which makes a bf16 run tens of times slower there."""
        if self.engine.precision != "auto":
            return self.engine.precision
        allowed = self.engine.zero_stage >= 1 and self.optimizer.name == "adamw"
        return "bf16" if bf16_hardware and allowed else "fp32"

    def phase(self, name: str) -> PhaseConfig:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase named {name!r} (phases: {[p.name for p in self.phases]})")


LAMB_ZERO_MESSAGE = (
    "optimizer.name=lamb cannot be combined with engine.zero_stage={stage}: ZeRO partitions "
    "parameters across ranks, so LAMB's per-layer trust ratio ||w|| / ||update|| would be "
    "computed on partitions instead of whole layers. Use optimizer.name=adamw with ZeRO, or lamb "
    "with engine.zero_stage=0."
)
# DeepSpeed 0.19.8 (runtime/engine.py `_do_optimizer_sanity_check`, `_configure_fp16_optimizer`):
# a stage-0 bf16 FusedLamb goes into FP16_UnfusedOptimizer (`fused_lamb_legacy`), whose fp32
# masters are private to the wrapper; at stage 1-2 FusedLamb is not a ZeRO-supported optimizer
# and its trust ratio would be taken over flat partitions.
LAMB_LOW_PRECISION_MESSAGE = (
    "optimizer.name=lamb cannot be combined with engine.precision={precision}: DeepSpeed 0.19 "
    "runs a {precision} LAMB only at engine.zero_stage=0, inside its FP16 optimizer wrapper, "
    "whose fp32 master weights no checkpoint or export reads (they would be {precision}-rounded), and with "
    "ZeRO LAMB's per-layer trust ratio would be computed on flat partitions. Use "
    "engine.precision=fp32 with lamb (matrix products run in TF32 on the GPU), or "
    "optimizer.name=adamw with bf16."
)
# Why: at stage 0 DeepSpeed 0.19 wraps the optimizer in its FP16 optimizer, whose fp32 master
# weights live only in that wrapper's private optimizer state; the checkpoint's "module" (what
# every export reads) holds the bf16/fp16-rounded copy. ZeRO 1-3 keep the masters in the
# optimizer-state files that DeepSpeed's own zero_to_fp32 consolidates (it supports stages 1-3
# only), and ZeRO-1 on one rank costs nothing.
LOW_PRECISION_ZERO0_MESSAGE = (
    "engine.precision={precision} cannot be combined with engine.zero_stage=0: DeepSpeed keeps "
    "the fp32 master weights of a stage-0 {precision} run only inside its FP16 optimizer "
    "wrapper, so checkpoints, the consolidated export and phase 2's starting weights would be "
    "{precision}-rounded. Use engine.zero_stage=1 (same memory on one rank; fp32 masters "
    "partitioned over ranks), or engine.precision=fp32."
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
    return PretrainConfig(model=ModelConfig(preset="bert_tiny"), phases=phases,
                          engine=EngineConfig(zero_stage=1, precision="auto"),
                          cadence=CadenceConfig(log_every=10, eval_every=100, eval_batches=5,
                                                checkpoint_every=100),
                          data=PretrainDataConfig(shuffle_buffer=500))


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

def _paper(preset: str) -> PretrainConfig:
    """BERT as in the paper on GPUs: 1M steps at batch 256, lr 1e-4, 10k warmup."""
    return PretrainConfig(model=ModelConfig(preset=preset), phases=_paper_phases(),
                          engine=EngineConfig(precision="bf16", zero_stage=2, device="cuda",
                                              compile=True),
                          cadence=CadenceConfig(log_every=100, eval_every=10_000,
                                                checkpoint_every=5_000))


def base() -> PretrainConfig:
    """BERT-base as in the paper: 1M steps at batch 256, lr 1e-4, 10k warmup."""
    return _paper("bert_base")


def large() -> PretrainConfig:
    """BERT-large as in the paper: 1M steps at batch 256, lr 1e-4, 10k warmup."""
    return _paper("bert_large")


PRESETS = {"tiny": tiny, "base": base, "large": large}


# ---------------------------------------------------------------- flat names

SECTIONS = {"model": ModelConfig, "objective": ObjectiveConfig, "optimizer": OptimizerConfig,
            "engine": EngineConfig, "data": PretrainDataConfig, "cadence": CadenceConfig}
"""The sections of `PretrainConfig` by their setting name."""
NEVER_FLAT = ("preset", "name", "probe_every", "report_to", "arch", "max_position_embeddings",
              "schedule", "decay_shape", "dynamic_masked_lm_prob_end")
"""Section fields the flat layout did not have under their own name (`model`, `objective` and
`optimizer` named the preset, objective and optimizer) or at all (the encoder's arch and
longest row, the schedule)."""
RENAMED_FIELDS = {"data.masked_lm_prob": "data.dynamic_masked_lm_prob"}
"""A section's field renamed: old dotted name -> new (make_shards' `masked_lm_prob` is another
setting, with another default). `bert-pretrain` and the flow (`pretrain.<old>`) refuse the old
name naming the new one; `load_saved` reads a saved config's value under the new name."""
_OLD_NAMES = {new: old for old, new in RENAMED_FIELDS.items()}

RENAMED_SETTINGS = {
    **{_OLD_NAMES.get(f"{section}.{f.name}", f".{f.name}").partition(".")[2]:
       f"{section}.{f.name}" for section, cls in SECTIONS.items()
       for f in dataclasses.fields(cls) if f.name not in NEVER_FLAT},
    "model": "model.preset", "objective": "objective.name", "optimizer": "optimizer.name"}
"""Flat setting -> its name in the sections (`zero_stage` -> `engine.zero_stage`, `model` ->
`model.preset`, `masked_lm_prob` -> `data.dynamic_masked_lm_prob`). `bert-pretrain` and the
flow (`pretrain.<old>`) refuse the flat name naming the new one; `load_saved` moves a flat
saved config's values there."""


def _is_flat(key: str, value: Any) -> bool:
    """Whether `key: value` is a setting of the flat layout: `model`, `objective` and
    `optimizer` are sections too, so set to a mapping they are the sections, set to a value
    the flat layout's settings."""
    return key in RENAMED_SETTINGS and not (key in SECTIONS and isinstance(value, Mapping))


def renamed_error(overrides: Mapping[str, Any]) -> str | None:
    """The one-line error for the first flat setting (`RENAMED_SETTINGS`) in `overrides` (a
    nested mapping of a PretrainConfig's settings), else None."""
    for key, value in overrides.items():
        if _is_flat(key, value):
            return f"setting {key} was renamed: it is now {RENAMED_SETTINGS[key]}"
    for old, new in RENAMED_FIELDS.items():
        section, _, name = old.partition(".")
        if isinstance(overrides.get(section), Mapping) and name in overrides[section]:
            return f"setting {old} was renamed: it is now {new}"
    return None


def migrate_flat(data: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config in the flat layout (each section's fields at the top level: the
    `config.json` of runs saved in that layout) in the sections' layout; one in the
    sections' layout unchanged but for a renamed field's value (`RENAMED_FIELDS`), read under
    its new name."""
    moved: dict[str, Any] = {}
    for key, value in data.items():
        if _is_flat(key, value):
            section, _, name = RENAMED_SETTINGS[key].partition(".")
            moved = settings.merge(moved, {section: {name: value}})
        else:
            moved = settings.merge(moved, {key: value})
    for old, new in RENAMED_FIELDS.items():
        (section, _, name), (_, _, new_name) = old.partition("."), new.partition(".")
        if isinstance(moved.get(section), Mapping) and name in moved[section]:
            fields = dict(moved[section])
            fields[new_name] = fields.pop(name)
            moved[section] = fields
    return moved


# ---------------------------------------------------------------- overrides

def to_dict(config: PretrainConfig) -> dict:
    """A JSON-able dict of the config (sections as mappings, phases as a list)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def from_dict(data: Mapping[str, Any], base: PretrainConfig | None = None,
              user_file: bool = False, label: str = "config key") -> PretrainConfig:
    """Apply a nested mapping (a YAML/JSON file's content) on top of `base`; validated once
    with `common.settings.apply`, the file's `phases` list merged by name (`_merge_phases`).
    `user_file`: a user's config file, told when its phases leave some of `base`'s out."""
    base = base or PretrainConfig()
    rest = {k: v for k, v in data.items() if k != "phases"}
    if "phases" in data:
        merged = _merge_phases(to_dict(base)["phases"], data["phases"], warn=user_file, label=label)
        # set with the other sections, in one step: the run's checks across them (a phase's
        # decay_steps and optimizer.schedule) see the final values of both
        rest["phases"] = [dataclasses.asdict(p) for p in _build_phases(merged)]
    return settings.apply(base, rest, label=label)


def _merge_phases(base: list[dict], entries: Any, warn: bool,
                  label: str = "config key") -> list[dict]:
    """A file's `phases` list is the run's phases, in its order. An entry with a `name` starts
    from the base phase of that name (so `{name: phase2, steps: 10}` keeps phase 2's length
    and learning rate), an unnamed one from the base phase at its position; phases of the base
    the list leaves out are not run, and a warning says so."""
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise ValueError(f"{label} 'phases' must be a list of phase mappings")
    by_name = {phase["name"]: phase for phase in base}
    phases = []
    for i, entry in enumerate(entries):
        if "name" in entry:
            phase = dict(by_name.get(str(entry["name"]), dataclasses.asdict(PhaseConfig())))
        else:
            phase = dict(base[i]) if i < len(base) else dataclasses.asdict(PhaseConfig())
        start = PhaseConfig(**{**phase, "name": str(entry.get("name", phase["name"]))})
        built = settings.apply(start, {k: v for k, v in entry.items() if k != "name"},
                               prefix=f"phases.{i}.", label=label)
        phases.append(dataclasses.asdict(built))
    dropped = [name for name in by_name if name not in {p["name"] for p in phases}]
    if dropped and warn:
        log.warning("the config file's phases %s leave out the preset's %s: not run",
                    [p["name"] for p in phases], dropped)
    return phases


def _build_phases(raw: list[dict]) -> tuple[PhaseConfig, ...]:
    """The validated phases of a to_dict-shaped list; an error names the phase."""
    phases = []
    for i, fields in enumerate(raw):
        try:
            phases.append(PhaseConfig(**fields))
        except SettingError as e:
            raise e.within(f"phases.{i}.", e.template) from None
    return tuple(phases)


def load_file(path: str, base: PretrainConfig | None = None) -> PretrainConfig:
    """Overrides from a `.yaml`/`.yml`/`.json` file; a flat setting fails naming its new name."""
    data = settings.load_file(path)
    try:
        renamed = renamed_error(data)
        if renamed:
            raise ValueError(renamed)
        return from_dict(data, base, user_file=True)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e


def apply_overrides(config: PretrainConfig, assignments: Sequence[str]) -> PretrainConfig:
    """Apply `key=value` strings (see the module docstring); validated after all of them, so
    their order does not matter (`phase1.steps=3` before `phase1.warmup_steps=1` is fine)."""
    overrides = settings.parse_assignments(assignments)
    renamed = renamed_error(overrides)
    if renamed:
        raise ValueError(renamed)
    return settings.apply(config, overrides, label="--set")


def resolve(preset: str = "tiny", config_file: str | None = None,
            assignments: Sequence[str] = ()) -> PretrainConfig:
    """Preset, then file, then `--set` overrides."""
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r}: expected one of {sorted(PRESETS)}")
    config = PRESETS[preset]()
    given_file = settings.load_file(config_file) if config_file else {}
    given_set = settings.parse_assignments(assignments)
    for given, where in ((given_file, f"{config_file}: "), (given_set, "")):
        renamed = renamed_error(given)
        if renamed:
            raise ValueError(where + renamed)
    shape = checkpoint_decides_shape(settings.merge(given_file, given_set))
    if shape:
        config = settings.apply(config, shape, label="--set")
    if config_file:
        config = load_file(config_file, config)
    return apply_overrides(config, assignments)


def checkpoint_decides_shape(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`{"model": {"preset": "", "init_from": ...}}` where `overrides` (of a PretrainConfig)
    name `model.init_from` and not `model.preset`: the checkpoint then decides the shape
    (training/init_from.py), not the preset's. The caller applies it with the overrides, before
    validation, so that a shape setting beside `init_from` is checked against the checkpoint,
    not the preset (`bert-pretrain --set` and the flow's `pretrain.*` alike)."""
    model = overrides.get("model")
    if not isinstance(model, Mapping) or not model.get("init_from") or "preset" in model:
        return {}
    return {"model": {"preset": "", "init_from": model["init_from"]}}


def save(config: PretrainConfig, path: str) -> None:
    from common import storage
    storage.atomic_write_json(path, to_dict(config))


def load_saved(path: str) -> PretrainConfig:
    """The config saved with a run or checkpoint (config.json), in either layout: a flat one
    (`migrate_flat`) is read as its sections, so an older run resumes."""
    with open(path, encoding="utf-8") as f:
        return from_dict(migrate_flat(json.load(f)))


# Settings a resumed run may change: where things are, how often to log/evaluate/save, and speed
# or memory knobs. (micro_batch_size: the global batch fixes the optimisation; the loader then
# resumes at the same share of the epoch. Shard locations: their content is compared instead.)
RESUME_FREE_FIELDS = ("output_dir", "data.vocab_dir", "data.num_workers", "engine.compile",
                      "engine.static_shapes", "engine.device", "cadence.log_every",
                      "cadence.eval_every", "cadence.eval_batches", "cadence.checkpoint_every",
                      "cadence.keep_checkpoints", "cadence.export_hf", "cadence.probe_every",
                      "cadence.report_to",
                      "phases.*.train_shards", "phases.*.validation_shards",
                      "phases.*.micro_batch_size")


def resume_conflicts(saved: PretrainConfig, current: PretrainConfig) -> list[str]:
    """`setting: saved -> current` for every setting outside RESUME_FREE_FIELDS that differs,
    by its dotted name (`engine.zero_stage: 1 -> 2`)."""
    old_all, new_all = to_dict(saved), to_dict(current)
    old, new = ({k: v for k, v in settings.dotted(d).items() if k != "phases"}
                for d in (old_all, new_all))
    free = set(RESUME_FREE_FIELDS)
    conflicts = [f"{key}: {old[key]!r} -> {new[key]!r}" for key in old
                 if key not in free and old[key] != new.get(key)]
    if len(old_all["phases"]) != len(new_all["phases"]):
        conflicts.append(f"phases: {[p['name'] for p in old_all['phases']]} -> "
                         f"{[p['name'] for p in new_all['phases']]}")
    for i, (a, b) in enumerate(zip(old_all["phases"], new_all["phases"])):
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
