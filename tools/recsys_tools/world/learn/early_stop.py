"""Early stopping for the build's networks: the parameters at the best checking score so
far, kept aside, restored at the end; training stops after `patience` epochs without one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class BestEpoch:
    """`better(score, best)`: whether an epoch's checking score beats the best so far;
    `best` starts at `worst` (inf for a loss, -inf for a hit rate)."""

    def __init__(
        self,
        parameters: Sequence[torch.nn.Parameter],
        patience: int,
        better: Callable[[float, float], bool],
        worst: float,
    ) -> None:
        self._parameters, self._patience, self._better = parameters, patience, better
        self.best, self._stale = worst, 0
        self._kept: list[torch.Tensor] | None = None

    def offer(self, score: float) -> bool:
        """Keeps the parameters if `score` is better; True when training should stop."""
        if self._better(score, self.best):
            self.best, self._stale = score, 0
            self._kept = [p.detach().clone() for p in self._parameters]
            return False
        self._stale += 1
        return self._stale >= self._patience

    def restore(self) -> None:
        """The best epoch's parameters back in place (none kept: left as they are)."""
        if self._kept is None:
            return
        import torch

        with torch.no_grad():
            for p, kept in zip(self._parameters, self._kept, strict=True):
                p.copy_(kept)
