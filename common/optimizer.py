"""The AdamW settings pre-training and fine-tuning share: `AdamWOptions`.

Declared once here; pre-training's `optimizer` section (training/config_sections.py
`OptimizerConfig`) and fine-tuning's loop options (finetune/loop.py `LoopOptions`) inherit it,
so each field, its docstring and its check are the same in both. The betas are not here:
fine-tuning runs `torch.optim.AdamW` at its default betas, and a fine-tuning run's folder is
keyed on all of its settings (finetune/run_store.py), so two more settings would re-key every
stored run.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.settings import check


@dataclass(frozen=True)
class AdamWOptions:
    """Decoupled weight decay, AdamW's epsilon and the gradient clip."""

    weight_decay: float = 0.01
    """AdamW decoupled weight decay (not on biases and LayerNorm)."""
    adam_epsilon: float = 1e-6
    """AdamW epsilon (the reference BERT optimizer's 1e-6, not PyTorch's 1e-8)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""

    def __post_init__(self) -> None:
        self.check_adamw()

    def check_adamw(self) -> None:
        """Each field in range, as `common.settings.SettingError` naming it."""
        for name in ("weight_decay", "max_grad_norm"):
            check(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        check(self.adam_epsilon > 0, "adam_epsilon", f"must be > 0, got {self.adam_epsilon}")
