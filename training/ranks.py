"""A pre-training process's place in the job (`Dist`) and how its ranks act as one
(`on_all_ranks`). Shared by training/pretrain.py and training/checkpoint.py; needs a started
`torch.distributed` process group, never DeepSpeed."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""
    rank: int
    world_size: int
    on_gpu: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class OtherRankError(ValueError):
    """A start-of-run check failed on another rank with a user error (its message says which)."""


def on_all_ranks(dist: Dist, check: Callable[[], Any], agree: str | None = None) -> Any:
    """Run a start-of-run check on every rank and make the ranks act as one. If the check
    raises on any rank (each reads its own filesystem: one node's copy may differ), every rank
    raises, so none waits forever at the next collective: the lowest failing rank its own
    error, every other rank an `OtherRankError` (a user error there) or a RuntimeError naming
    it, so that the error is reported once. With `agree`
    (what the result says), results that differ between ranks are an error too. Returns rank
    0's result."""
    from common.errors import is_user_error

    error = None
    try:
        outcome = (check(), None)
    except Exception as e:  # noqa: BLE001 (every rank must reach the gather below, whatever failed)
        error = e
        outcome = (None, (type(e).__name__, str(e), is_user_error(e)))
    outcomes: list = [None] * dist.world_size
    torch.distributed.all_gather_object(outcomes, outcome)
    failed = [rank for rank, (_, failure) in enumerate(outcomes) if failure is not None]
    if failed and failed[0] == dist.rank:
        raise error  # the lowest failing rank reports; the others name it
    if failed:
        name, message, user = outcomes[failed[0]][1]
        if user:
            raise OtherRankError(f"on rank {failed[0]}: {message}")
        raise RuntimeError(f"on rank {failed[0]}: {name}: {message}")
    results = [result for result, _ in outcomes]
    if agree and any(r != results[0] for r in results):
        raise ValueError(f"the ranks disagree on {agree} ({results}, by rank): give every "
                         "node the same files")
    return results[0]
