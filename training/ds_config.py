"""The DeepSpeed config of one phase and its lr schedule (training/optim.py: groups, schedule).

AdamW(0.9, 0.999, eps 1e-6, weight decay 0.01 except LayerNorm weights and biases) with linear
warmup then linear decay to 0 (the paper, section A.2; `LinearWarmupDecay`, handed to
`deepspeed.initialize` as the client scheduler), gradient clipping 1.0, ZeRO stage 0-3, bf16
(CPU and GPU) or fp16 (GPU, dynamic loss scale) with ZeRO >= 1.

Why not DeepSpeed's `WarmupDecayLR`: it rounds `warmup_num_steps` of 0 or 1 up to 2 (0 raises
in 0.19.8) and starts one step late (optimizer steps 0 and 1 both run at lr 0, the peak comes at
step warmup + 1). `LinearWarmupDecay` runs step s at `lr * s / warmup` for s < warmup (so, like
the reference's optimization.py, the first step runs at lr 0 when there is a warmup), then
`lr * (steps - s) / (steps - warmup)`.

On CPU the optimizer is `torch.optim.AdamW` (`torch_adam: true`): DeepSpeed's FusedAdam and
DeepSpeedCPUAdam are C++ ops that would be compiled at run time. LAMB is DeepSpeed's FusedLamb
(a CUDA op): GPU only, and only without ZeRO partitioning.

Communication (`zero_section`, `data_types`): the gradient reduction overlaps the backward pass.
With `overlap_comm` DeepSpeed's ZeRO 1-2 optimizer reduces each bucket of `REDUCE_BUCKET_SIZE`
gradient elements on a side stream as soon as the backward has filled it, so all but the last
bucket's reduction hides behind the layers still computing (BERT-large's 335M gradients are 670 MB
in bf16: ~7 buckets). Without it the whole reduction runs after the backward, and phase 1, which
has no accumulation, pays it every step. The GPU presets use ZeRO-2, where the reduce-scatter runs
every micro-batch (overlapped) into this rank's gradient partition, which is accumulated in fp32
(`data_types.grad_accum_dtype`) when a step has several micro-batches. Why not ZeRO-1 with fp32
accumulation: DeepSpeed 0.19.8 (engine `_do_optimizer_sanity_check`) then replaces the ZeRO
optimizer by its `BF16_Optimizer`, which reads none of the bucket or overlap keys and reduces all
gradients after the backward. ZeRO-1 therefore keeps bf16 accumulation (and overlaps the reduction
of the last micro-batch only); stage 3 accumulates in fp32 by itself. On CPU (gloo) the same keys
apply; DeepSpeed's CPU accelerator runs the "side stream" in line, so nothing overlaps there.
"""
from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

from training.config import LAMB_ZERO_MESSAGE, PhaseConfig, PretrainConfig
from training.optim import LinearWarmupDecay, WarmupStableDecay


def build_ds_config(config: PretrainConfig, phase: PhaseConfig, world_size: int,
                    on_gpu: bool, load_universal: bool = False) -> dict[str, Any]:
    """The `config` dict for `deepspeed.initialize` for one phase on `world_size` ranks."""
    optimizer, engine = config.optimizer, config.engine
    if optimizer.name == "lamb" and engine.zero_stage >= 1:
        raise ValueError(LAMB_ZERO_MESSAGE.format(stage=engine.zero_stage))
    if optimizer.name == "lamb" and not on_gpu:
        raise ValueError("optimizer.name=lamb uses DeepSpeed's FusedLamb, a CUDA op: it needs a "
                         "GPU (use optimizer.name=adamw on CPU)")
    if engine.precision == "fp16" and not on_gpu:
        raise ValueError("engine.precision=fp16 needs a GPU (the CPU accelerator has no fp16 "
                         "training); use engine.precision=bf16 or fp32 on CPU")
    ds: dict[str, Any] = {
        "train_batch_size": phase.global_batch_size,
        "train_micro_batch_size_per_gpu": phase.micro_batch_size,
        "gradient_accumulation_steps": phase.gradient_accumulation_steps(world_size),
        "gradient_clipping": optimizer.max_grad_norm,
        "zero_optimization": zero_section(engine.zero_stage),
        "optimizer": optimizer_section(config, phase, on_gpu),
        "bf16": {"enabled": engine.precision == "bf16"},
        "fp16": {"enabled": engine.precision == "fp16", "loss_scale": 0,
                 "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                 "min_loss_scale": 1},
        "steps_per_print": 1 << 30,  # training/pretrain.py logs its own metrics
        "wall_clock_breakdown": False,
    }
    if types := data_types(config, phase, world_size):
        ds["data_types"] = types
    if load_universal:
        ds["checkpoint"] = {"load_universal": True}
    return ds


REDUCE_BUCKET_SIZE = 50_000_000
"""Gradient elements per reduction (100 MB in bf16): large enough for NCCL's full bandwidth,
small enough that BERT-large's backward fills ~7 buckets, so their reductions overlap the layers
still computing. With `overlap_comm` DeepSpeed holds ~4.5x this in buffers (~450 MB in bf16)."""
ALLGATHER_BUCKET_SIZE = 50_000_000
"""Parameter elements per all-gather of the updated partitions after the optimizer step."""


def zero_section(stage: int) -> dict[str, Any]:
    """ZeRO keys of `stage`: overlapped, bucketed gradient reduction (see the module docstring)."""
    section: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        section.update(contiguous_gradients=True, overlap_comm=True, reduce_scatter=True,
                       reduce_bucket_size=REDUCE_BUCKET_SIZE,
                       allgather_bucket_size=ALLGATHER_BUCKET_SIZE)
    if stage == 3:
        # Gather the full fp16/bf16 weights on save too, so a module-only export is possible.
        section["stage3_gather_16bit_weights_on_model_save"] = True
    return section


def data_types(config: PretrainConfig, phase: PhaseConfig, world_size: int) -> dict[str, str]:
    """`grad_accum_dtype` fp32 where it keeps the ZeRO optimizer and its overlap: bf16 at ZeRO-2
    with several micro-batches per step. Not at ZeRO-1 (DeepSpeed would switch to its
    BF16_Optimizer, which ignores overlap and buckets), not without accumulation (nothing to
    accumulate), not at ZeRO-3 (fp32 already), not for fp16/fp32 (their own paths)."""
    if config.engine.precision == "bf16" and config.engine.zero_stage == 2 and \
            phase.gradient_accumulation_steps(world_size) > 1:
        return {"grad_accum_dtype": "fp32"}
    return {}


def optimizer_section(config: PretrainConfig, phase: PhaseConfig, on_gpu: bool) -> dict[str, Any]:
    optimizer = config.optimizer
    betas = [optimizer.adam_beta1, optimizer.adam_beta2]
    if optimizer.name == "lamb":
        return {"type": "Lamb", "params": {"lr": phase.learning_rate, "betas": betas,
                                           "eps": optimizer.adam_epsilon,
                                           "weight_decay": optimizer.weight_decay,
                                           "max_coeff": 10.0, "min_coeff": 0.01}}
    return {"type": "AdamW", "params": {"lr": phase.learning_rate, "betas": betas,
                                        "eps": optimizer.adam_epsilon,
                                        "weight_decay": optimizer.weight_decay,
                                        "torch_adam": not on_gpu, "adam_w_mode": True}}


def lr_scheduler(phase: PhaseConfig, schedule: str = "linear", decay_shape: str = "1-sqrt"):
    """The callable `deepspeed.initialize(lr_scheduler=...)` calls with the optimizer: the
    `optimizer.schedule` of the run (linear, or wsd with the phase's `decay_steps`)."""
    def build(optimizer: Optimizer) -> LinearWarmupDecay:
        if schedule == "wsd":
            return WarmupStableDecay(optimizer, phase.learning_rate, phase.warmup_steps,
                                     phase.steps, phase.decay_steps, decay_shape)
        return LinearWarmupDecay(optimizer, phase.learning_rate, phase.warmup_steps, phase.steps)
    return build
