"""Ops that make the host wait for a GPU, counted where they would run: a training step that
waits once per layer for the device to count something stalls the kernel queue each time.

`SyncCounter` sees them on any device (a `TorchDispatchMode`), so CPU tests hold the step to
zero; on a GPU `torch.cuda.set_sync_debug_mode("error")` is the same check by the driver
(benchmarks/gpu_check.py runs both).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"nonzero", "masked_select", "masked_scatter", "_local_scalar_dense", "is_nonzero",
            "equal", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim"}
"""aten ops whose output size or value the host must read from the device (a GPU sync)."""
INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
"""Indexing ops that sync when an index is boolean (the kernel counts the True first)."""


class SyncCounter(TorchDispatchMode):
    """Records every op that makes the host wait for a GPU (on CPU they just run)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        counts_on_device = (name == "repeat_interleave" and len(args) < 3
                            and (kwargs or {}).get("output_size") is None)
        if name in SYNC_OPS or counts_on_device:
            self.ops.append(name)
        elif name in INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                       for i in args[1]):
            self.ops.append(f"{name} (boolean index)")
        return func(*args, **(kwargs or {}))
