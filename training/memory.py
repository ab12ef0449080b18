"""GPU memory of a pre-training rank, estimated from the model's shape: what the presets'
micro-batches are chosen from, and what benchmarks/gpu_check.py compares its peak against.

Per parameter (DeepSpeed, bf16 with ZeRO stage >= 1 over N ranks): bf16 weights 2 bytes, bf16
gradients 2 (stage 2+: partitioned, 2 / N), and the optimizer's fp32 master weights, Adam's two
moments and the fp32 gradient partition, 16 / N. In fp32 at stage 0: weights 4, gradients 4,
moments 8.

Per sequence, the activations the backward keeps, as the encoder counts them
(`activation_bytes` of model/bert.py and model/modernbert.py: Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", table 2, without the T x T
terms that a flash kernel does not store; BERT's 16 values of the hidden width per layer and
token and two 1-byte dropout masks are 34 H bytes in bf16, ModernBERT's GeGLU keeps 4 I values
where BERT's feed-forward keeps 2 I). Plus the MLM head's: the logits of the masked positions
in bf16 and their fp32 log-softmax, at the encoder's recipe's share of masked tokens
(`masked_share`: BERT 15.6%, ModernBERT 30%).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.encoders import activation_bytes, count_parameters, encoder_of

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


def parameter_count(model: Any, next_sentence: bool | None = None) -> int:
    """Parameters of the pre-training model on the encoder config `model`, counted on the model
    itself built on the meta device (any arch; tied parameters once): the MLM head and, where
    `next_sentence` (None: as the encoder's published checkpoints, BERT's yes, ModernBERT's
    no), the NSP head."""
    from model.heads import BertForPreTraining
    if next_sentence is None:
        next_sentence = encoder_of(model).hf.NEXT_SENTENCE
    return count_parameters(model, lambda c: BertForPreTraining(c, next_sentence=next_sentence))


def max_predictions(seq_len: int, share: float = 0.15625) -> int:
    """Masked positions per row at `share` of its tokens: BERT's 20 at 128 tokens, 80 at 512
    (an encoder config's `masked_share` gives its recipe's)."""
    return max(1, round(seq_len * share))


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
    mlm = max_predictions(seq_len, model.masked_share) * model.vocab_size * (value + 4)
    activations = activation_bytes(model, seq_len, value) + mlm
    return MemoryEstimate(n, int(states), WORKSPACE_BYTES, int(activations), micro_batch_size)


def describe(estimate: MemoryEstimate) -> str:
    """One line in GiB."""
    return (f"{estimate.parameters / 1e6:.0f}M parameters: states "
            f"{estimate.model_states / GIB:.2f} GiB + workspace {estimate.workspace / GIB:.1f} "
            f"GiB + {estimate.micro_batch_size} x {estimate.activations_per_sequence / 2**20:.0f}"
            f" MiB activations = {estimate.total / GIB:.1f} GiB")

