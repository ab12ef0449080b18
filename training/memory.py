"""GPU memory of a pre-training rank, estimated from the model's shape: what the presets'
micro-batches are chosen from, and what benchmarks/gpu_check.py compares its peak against.

Per parameter (DeepSpeed, bf16 with ZeRO stage >= 1 over N ranks): bf16 weights 2 bytes, bf16
gradients 2 (stage 2+: partitioned, 2 / N), and the optimizer's fp32 master weights, Adam's two
moments and the fp32 gradient partition, 16 / N. In fp32 at stage 0: weights 4, gradients 4,
moments 8.

Per sequence, the activations the backward keeps (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", table 2, without the T x T terms that
a flash kernel does not store): per layer and token 16 values of the hidden width (LayerNorm
inputs, q/k/v and the attention output, the 4H feed-forward input and GELU output) and two
1-byte dropout masks: 34 H bytes in bf16. Plus the embeddings' and the MLM head's (the logits
of the masked positions in bf16 and their fp32 log-softmax).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.encoders import count_parameters

GIB = 2**30
WORKSPACE_BYTES = 3 * GIB
"""CUDA context, cuBLAS/flash workspaces and DeepSpeed's reduce/all-gather buckets, together."""
FRAGMENTATION = 0.9
"""Share of a GPU's memory the caching allocator can hand out to tensors in practice."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank holds at the peak of a training step."""

    parameters: int
    """Parameter count of the model."""
    model_states: int
    """Weights, gradients and optimizer states (this rank's share)."""
    workspace: int
    """Fixed buffers (`WORKSPACE_BYTES`)."""
    activations_per_sequence: int
    """Activations kept for the backward, per row of the micro-batch."""
    micro_batch_size: int
    """Rows per micro-batch."""

    @property
    def total(self) -> int:
        return self.model_states + self.workspace + \
            self.micro_batch_size * self.activations_per_sequence

    def largest_micro_batch(self, gpu_bytes: int) -> int:
        """The most rows that fit `gpu_bytes` of GPU memory (allocator slack included)."""
        free = gpu_bytes * FRAGMENTATION - self.model_states - self.workspace
        return max(0, int(free // self.activations_per_sequence))


def parameter_count(model: Any) -> int:
    """Parameters of the pre-training model on the encoder config `model` (tied decoder, NSP
    head), counted on the model itself built on the meta device (any arch)."""
    from model.heads import BertForPreTraining
    return count_parameters(model, BertForPreTraining)


def max_predictions(seq_len: int) -> int:
    """BERT's masked positions per row: 20 at 128 tokens, 80 at 512."""
    return max(1, round(seq_len * 0.15625))


def estimate(model: Any, seq_len: int, micro_batch_size: int, ranks: int = 1,
             precision: str = "bf16", zero_stage: int = 1) -> MemoryEstimate:
    """The `MemoryEstimate` of one rank (see the module docstring for the terms)."""
    n = parameter_count(model)
    value = 4 if precision == "fp32" else 2  # bytes per activation / weight value
    if precision == "fp32" and zero_stage == 0:
        states = 16 * n
    else:
        gradients = value * n / (ranks if zero_stage >= 2 else 1)
        optimizer = 16 * n / (ranks if zero_stage >= 1 else 1)
        states = value * n + gradients + optimizer
    H = model.hidden_size
    per_token_layer = (8 * H + 2 * model.intermediate_size) * value + 2 * H  # BERT: 16 H
    embeddings = seq_len * (2 * value * H + H)
    mlm = max_predictions(seq_len) * model.vocab_size * (value + 4)
    activations = model.num_hidden_layers * seq_len * per_token_layer + embeddings + mlm
    return MemoryEstimate(n, int(states), WORKSPACE_BYTES, int(activations), micro_batch_size)


def describe(estimate: MemoryEstimate) -> str:
    """One line in GiB."""
    return (f"{estimate.parameters / 1e6:.0f}M parameters: states "
            f"{estimate.model_states / GIB:.2f} GiB + workspace {estimate.workspace / GIB:.1f} "
            f"GiB + {estimate.micro_batch_size} x {estimate.activations_per_sequence / 2**20:.0f}"
            f" MiB activations = {estimate.total / GIB:.1f} GiB")

