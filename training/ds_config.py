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
"""
from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

from training.config import LAMB_ZERO_MESSAGE, PhaseConfig, PretrainConfig
from training.optim import LinearWarmupDecay


def build_ds_config(config: PretrainConfig, phase: PhaseConfig, world_size: int,
                    on_gpu: bool, load_universal: bool = False) -> dict[str, Any]:
    """The `config` dict for `deepspeed.initialize` for one phase on `world_size` ranks."""
    if config.optimizer == "lamb" and config.zero_stage >= 1:
        raise ValueError(LAMB_ZERO_MESSAGE.format(stage=config.zero_stage))
    if config.optimizer == "lamb" and not on_gpu:
        raise ValueError("optimizer=lamb uses DeepSpeed's FusedLamb, a CUDA op: it needs a GPU "
                         "(use optimizer=adamw on CPU)")
    if config.precision == "fp16" and not on_gpu:
        raise ValueError("precision=fp16 needs a GPU (the CPU accelerator has no fp16 training); "
                         "use precision=bf16 or fp32 on CPU")
    ds: dict[str, Any] = {
        "train_batch_size": phase.global_batch_size,
        "train_micro_batch_size_per_gpu": phase.micro_batch_size,
        "gradient_accumulation_steps": phase.gradient_accumulation_steps(world_size),
        "gradient_clipping": config.max_grad_norm,
        "zero_optimization": zero_section(config.zero_stage),
        "optimizer": optimizer_section(config, phase, on_gpu),
        "bf16": {"enabled": config.precision == "bf16"},
        "fp16": {"enabled": config.precision == "fp16", "loss_scale": 0,
                 "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                 "min_loss_scale": 1},
        "steps_per_print": 1 << 30,  # training/pretrain.py logs its own metrics
        "wall_clock_breakdown": False,
    }
    if load_universal:
        ds["checkpoint"] = {"load_universal": True}
    return ds


def zero_section(stage: int) -> dict[str, Any]:
    section: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        section.update(contiguous_gradients=True, overlap_comm=False,
                       reduce_bucket_size=50_000_000, allgather_bucket_size=50_000_000)
    if stage == 3:
        # Gather the full fp16/bf16 weights on save too, so a module-only export is possible.
        section["stage3_gather_16bit_weights_on_model_save"] = True
    return section


def optimizer_section(config: PretrainConfig, phase: PhaseConfig, on_gpu: bool) -> dict[str, Any]:
    betas = [config.adam_beta1, config.adam_beta2]
    if config.optimizer == "lamb":
        return {"type": "Lamb", "params": {"lr": phase.learning_rate, "betas": betas,
                                           "eps": config.adam_epsilon,
                                           "weight_decay": config.weight_decay,
                                           "max_coeff": 10.0, "min_coeff": 0.01}}
    return {"type": "AdamW", "params": {"lr": phase.learning_rate, "betas": betas,
                                        "eps": config.adam_epsilon,
                                        "weight_decay": config.weight_decay,
                                        "torch_adam": not on_gpu, "adam_w_mode": True}}


def lr_scheduler(phase: PhaseConfig):
    """The callable `deepspeed.initialize(lr_scheduler=...)` calls with the optimizer."""
    def build(optimizer: Optimizer) -> LinearWarmupDecay:
        return LinearWarmupDecay(optimizer, phase.learning_rate, phase.warmup_steps, phase.steps)
    return build
