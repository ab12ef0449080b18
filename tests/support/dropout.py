"""Task models with dropout turned off, for step-for-step comparisons with a peer's run."""
from __future__ import annotations

import torch


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a task model over `model.bert`) with every dropout at 0, attention's included;
    changed in place and returned."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for layer in model.bert.layers:
        layer.attention.dropout_p = 0.0
    return model
