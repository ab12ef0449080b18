"""The sections of a pre-training run's config (training/config.py `PretrainConfig`), each a
small frozen dataclass, as torchtitan's `JobConfig` sections: `model` (the encoder: preset,
shape, dropout, `init_from`; `ModelConfig.build` is where a run's `model.bert.BertConfig` is
made), `objective`, `optimizer` (its AdamW fields are common/optimizer.py's, shared with
fine-tuning), `engine` (precision and parallelism), `data` (vocabulary, dynamic masking,
loader) and `cadence` (logging, evaluation, checkpoints, export). The phases are
training/config.py's `PhaseConfig`.

A check within one section names its field there (`ensure`); the checks across sections
are `PretrainConfig`'s. training/config.py exports every name here, so `from training.config
import ModelConfig` is the one import a run's code needs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from common import settings
from common.masking import MaskingConfig, MaskSplit
from common.optimizer import AdamWOptions
from common.settings import SettingError
from model.encoders import ENCODERS, arch_of_preset
from model.encoders import PRESETS as MODEL_PRESETS

if TYPE_CHECKING:
    from model.encoders import EncoderConfig


SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
"""`model` settings that override the preset's shape (0 = the preset's value)."""
MASKING_FIELDS = ("dynamic_masked_lm_prob", "dynamic_masked_lm_prob_end",
                  *(f.name for f in dataclasses.fields(MaskSplit)))
"""`data` settings of dynamic masking (`data.dynamic_masking=true`)."""


def ensure(ok: bool, flag: str, expected: str) -> None:
    """Unless `ok`, a `SettingError` naming `flag`: `--set <flag>: must be <expected>`."""
    if not ok:
        raise SettingError(flag, f"must be {expected}", "--set {setting}: {message}")


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
        ensure(self.arch in ("", *ENCODERS), "arch", f"one of {sorted(ENCODERS)} (or empty)")
        if self.arch and self.preset in MODEL_PRESETS and arch_of_preset(self.preset) != self.arch:
            size = self.preset.rpartition("_")[2]
            ensure(f"{self.arch}_{size}" in MODEL_PRESETS, "arch",
                   f"an arch with a {size} preset (preset={self.preset})")
            object.__setattr__(self, "preset", f"{self.arch}_{size}")  # the arch's own preset
        ensure(self.preset in MODEL_PRESETS or (self.preset == "" and bool(self.init_from)),
               "preset", f"one of {sorted(MODEL_PRESETS)} (or empty with init_from)")
        for flag in SHAPE_FIELDS:
            ensure(getattr(self, flag) >= 0, flag, ">= 0 (0 = the preset's)")
        if self.preset:  # with init_from and no preset the checkpoint's shape is checked at start
            shape = {**MODEL_PRESETS[self.preset]().to_dict(), **self.shape()}
            ensure(shape["hidden_size"] % shape["num_attention_heads"] == 0, "hidden_size",
                   f"a multiple of num_attention_heads (got hidden_size={shape['hidden_size']}, "
                   f"num_attention_heads={shape['num_attention_heads']}, "
                   f"preset={self.preset})")
        ensure(0 <= self.dropout < 1, "dropout", "in [0, 1)")

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
            ensure(0 <= getattr(self, flag) < 1, flag, "in [0, 1)")


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
        ensure(self.shuffle_buffer >= 0, "shuffle_buffer", ">= 0")
        ensure(self.num_workers >= 0, "num_workers", ">= 0")

    def masking(self, max_predictions_per_seq: int) -> MaskingConfig:
        """Dynamic masking's `common.masking.MaskingConfig`, capped as the shards are."""
        split = {f.name: getattr(self, f.name) for f in dataclasses.fields(MaskSplit)}
        return MaskingConfig(masked_lm_prob=self.dynamic_masked_lm_prob or 0.15,
                             max_predictions_per_seq=max_predictions_per_seq, **split)

    def _check_masking(self) -> None:
        ensure(0 <= self.dynamic_masked_lm_prob < 1, "dynamic_masked_lm_prob",
               "in [0, 1) (0 = the shards' count)")
        ensure(0 <= self.dynamic_masked_lm_prob_end < 1, "dynamic_masked_lm_prob_end",
               "in [0, 1) (0 = a fixed share)")
        ensure(not self.dynamic_masked_lm_prob_end or self.dynamic_masked_lm_prob > 0,
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
        ensure(self.log_every > 0, "log_every", "positive")
        for flag in ("eval_every", "eval_batches", "checkpoint_every", "probe_every"):
            ensure(getattr(self, flag) >= 0, flag, ">= 0")
        ensure(self.keep_checkpoints >= 1, "keep_checkpoints", ">= 1")
        self._check_report_to()

    def _check_report_to(self) -> None:
        from training.trackers import check_names
        # a config file's or config.json's list, given as it is read (`from_dict`)
        object.__setattr__(self, "report_to", tuple(self.report_to))
        check_names(self.report_to)


SECTIONS = {"model": ModelConfig, "objective": ObjectiveConfig, "optimizer": OptimizerConfig,
            "engine": EngineConfig, "data": PretrainDataConfig, "cadence": CadenceConfig}
"""The sections of `PretrainConfig` by their setting name."""
