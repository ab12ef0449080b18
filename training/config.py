"""Typed configuration of a pre-training run: presets, file/CLI overrides, validation.

A run is a sequence of phases (the paper, section A.2: 90% of the steps at 128 tokens, then 10%
at 512 tokens). Each phase has its own shards, batch and learning-rate schedule; phase 2 starts
from phase 1's weights with a fresh optimizer and schedule.

`PretrainConfig` is made of sections, each a small frozen dataclass (torchtitan's `JobConfig`;
training/config_sections.py): `model` (the encoder: preset, shape, dropout, `init_from`;
`ModelConfig.build` is where a run's `model.bert.BertConfig` is made), `objective`, `optimizer`
(its AdamW fields are common/optimizer.py's, shared with fine-tuning), `engine` (precision and
parallelism), `data` (vocabulary, dynamic masking, loader), `cadence` (logging, evaluation,
checkpoints, export), and here `phases`, and at the top level `output_dir` and `seed`. A check
within one section names its field there; the checks across sections (LAMB with ZeRO, low
precision with ZeRO 0, the objective's own) are `PretrainConfig`'s and name the settings by
their dotted names. Every name of the sections' module is importable from this one.

Overrides, applied in order after the preset:
- `--config run.yaml` (or `.json`): a nested mapping (`engine: {zero_stage: 2}`); `phases` a
  list, the run's phases, each merged into the preset's phase of its name (`_merge_phases`).
- `--set key=value` (repeatable): dotted keys, `engine.zero_stage=2`, `phases.0.steps=300` or
  by phase name, `phase1.learning_rate=5e-4`. Both go through `common.settings.apply`, the
  mechanism the flow's `--set` uses too, which converts each value to its field's type (`1e-4`
  a float, `true`/`false` a bool, text as given).

A flat name of the sections' fields (`zero_stage`, `model=bert_base`) fails naming its dotted
one (`RENAMED_SETTINGS`, training/renamed_settings.py, which the flow's `pretrain.*` settings use
as well); a run's own saved `config.json` in the flat layout loads as its sections
(`load_saved`), so such runs resume.

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
from typing import Any

import yaml

from common import settings
from common.settings import SettingError
from model.encoders import PRESETS as MODEL_PRESETS

# exported from here too: a run's config is one import, whichever module declares a name
from training.config_sections import (  # noqa: F401
    MASKING_FIELDS,
    SECTIONS,
    SHAPE_FIELDS,
    CadenceConfig,
    EngineConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimizerConfig,
    PretrainDataConfig,
    ensure,
)
from training.renamed_settings import (  # noqa: F401
    NEVER_FLAT,
    RENAMED_FIELDS,
    RENAMED_SETTINGS,
    migrate_flat,
    renamed_error,
)

log = logging.getLogger(__name__)


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
        ensure(bool(self.name) and "/" not in self.name, "name", "a non-empty name without '/'")
        ensure(self.rope_theta >= 0, "rope_theta", ">= 0 (0 = the model's)")
        ensure(0 <= self.batch_warmup_rows <= self.global_batch_size
               and self.batch_warmup_rows % self.micro_batch_size == 0, "batch_warmup_rows",
               f"a multiple of micro_batch_size={self.micro_batch_size} in [0, "
               f"global_batch_size={self.global_batch_size}], got {self.batch_warmup_rows}")
        ensure(self.batch_warmup_tokens >= 0 and
               bool(self.batch_warmup_tokens) == bool(self.batch_warmup_rows),
               "batch_warmup_tokens", "> 0 with batch_warmup_rows (and 0 without)")
        for flag in ("max_seq_length", "micro_batch_size", "global_batch_size", "steps"):
            ensure(getattr(self, flag) > 0, flag, "positive")
        ensure(0 <= self.warmup_steps <= self.steps, "warmup_steps",
               f"in [0, steps={self.steps}], got {self.warmup_steps}")
        ensure(0 <= self.decay_steps <= self.steps - self.warmup_steps, "decay_steps",
               f"in [0, steps - warmup_steps = {self.steps - self.warmup_steps}], got "
               f"{self.decay_steps}")
        ensure(self.learning_rate > 0, "learning_rate", "positive")
        ensure(self.global_batch_size % self.micro_batch_size == 0, "global_batch_size",
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
        ensure(len(self.phases) > 0, "phases", "at least one phase")
        names = [p.name for p in self.phases]
        ensure(len(set(names)) == len(names), "phases", f"uniquely named, got {names}")
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
