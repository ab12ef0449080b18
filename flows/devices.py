"""The devices fine-tuning runs train on, lent to one run at a time."""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence


def fine_tuning_devices(num_gpus: int | None = None) -> list[str]:
    """Where fine-tuning runs train: every GPU torch sees, else the CPU."""
    if num_gpus is None:
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(num_gpus)] or ["cpu"]


class DevicePool:
    """Devices lent to one run at a time: the flow maps fine-tuning runs onto threads, and two runs
    on one device would only share its cores or its memory. A run takes whichever device is
    free, so uneven runs keep every device busy."""

    def __init__(self, devices: Sequence[str]):
        self._free: queue.Queue[str] = queue.Queue()
        for device in devices:
            self._free.put(device)

    @contextlib.contextmanager
    def take(self) -> Iterator[str]:
        device = self._free.get()
        try:
            yield device
        finally:
            self._free.put(device)


_POOL: DevicePool | None = None
_POOL_GUARD = threading.Lock()


def device_pool() -> DevicePool:
    """The process's one pool over `fine_tuning_devices()`, made on first use."""
    global _POOL
    with _POOL_GUARD:
        if _POOL is None:
            _POOL = DevicePool(fine_tuning_devices())
        return _POOL
