"""`torch.compile` of the encoder (model/bert.py): per layer for batches whose shape changes
(`compile_layers`), or a whole model as one graph for batches of one shape (`compile_model`,
`training.batching.StaticShapes`). Parameter names and state dicts stay as they are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from model.bert import BertModel


LAYER_RECOMPILE_LIMIT = 64
"""Compiled variants a layer may have (dynamo's `recompile_limit`, 8 by default). One code object,
`BertLayer.forward`, serves every layer in several forms: all tokens or only the masked
positions (the last layer in pre-training), training or evaluation, with or without grad, and
each first with static then with symbolic sizes as T, B and the masked positions change. A
phase 1, its validation, a phase 2 of another micro-batch and its validation make 10
(tests/model/test_attention_paths.py), past 8: with fullgraph=True the 9th is an error, which
stopped phase 2 of a GPU run (RESULTS 16)."""


def compile_layers(bert: BertModel, backend: str = "inductor") -> BertModel:
    """`torch.compile` every encoder layer in place (`fullgraph=True`: a graph break is an
    error, not a silent slowdown), so bias + GELU, dropout + residual and LayerNorm fuse into
    a few kernels; parameter names and the state dict stay as they are. `backend`: inductor;
    tests trace with aot_eager, which checks the same graphs and guards without code generation.

    A layer has no data-dependent shape inside it: the attention plan's indices (CPU) and the
    row masks (GPU) come ready, so a new batch shape at most recompiles (sizes become symbolic
    after the second one), never breaks the graph. Embeddings and heads stay eager.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               LAYER_RECOMPILE_LIMIT)
    for layer in bert.layers:
        layer.compile(fullgraph=True, backend=backend)
    return bert


MODEL_RECOMPILE_LIMIT = 16
"""Compiled variants of a whole pre-training model (`compile_model`): per phase a training and
an evaluation graph, each static (`dynamic=False`), and one more for a rare batch past the
static shapes (`training.batching.StaticShapes.fit`); two phases make 4 to 8."""


def compile_model(model: nn.Module, backend: str = "inductor", mode: str | None = None) -> nn.Module:
    """`torch.compile` a whole model in place, as one graph: for pre-training the embeddings,
    every layer, the heads and the losses, so that a step is a few kernel launches from one
    host call rather than a compiled call per layer with eager ops between them.

    For batches of one shape (`training.batching.StaticShapes`): `dynamic=False` specialises the
    graph to it (symbolic sizes would cost kernel choices and rule out CUDA graphs), and
    `fullgraph=True` makes any graph break an error. Attention takes whole rows under the
    instance mask inside the graph (the CPU's per-instance plan is host work with batch-dependent
    sizes; `BertModel.forward`). `mode`: torch.compile's (None, "reduce-overhead" for CUDA
    graphs, "max-autotune-no-cudagraphs"); `backend` as in `compile_layers`. Parameter names
    and the state dict stay as they are. For batches of changing shape use `compile_layers`.

    The model's `forward` is compiled, not its `__call__` (`nn.Module.compile`): hooks others
    hang on the model stay outside the graph. DeepSpeed's engine adds a forward pre-hook that
    reads its step counter; traced, it is a guard that fails at every step (a recompile per
    step, tests/training/test_static_shapes.py).
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               MODEL_RECOMPILE_LIMIT)
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False, backend=backend,
                                  mode=mode)
    return model

