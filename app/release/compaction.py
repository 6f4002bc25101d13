"""The catalog's change log folded into each item's latest state.

Re-puts and withdrawals would grow the log without end (a page of re-puts of a thousand
items is a few hundred megabytes). Folded, it holds each item once: its latest put (its
vector the latest refit's), then every item withdrawn. Applied to a room, the fold leaves it
as the batches it folds would: the same rows, the same withdrawn mask, the same digest.
A batch a room cannot apply is left out of the fold, as every process skips it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.core.errors import UnappliableBatchError
from app.release.arrivals import ChangeBatch, ItemChange, Withdrawal

# Changes per batch of a fold: a batch is one entry of the log, read whole.
PART_CHANGES = 1000


@dataclass(slots=True)
class Fold:
    """Each item's latest put, and the items withdrawn, in the order first changed."""

    puts: dict[str, ItemChange] = dataclasses.field(default_factory=dict)
    withdrawn: dict[str, Withdrawal] = dataclasses.field(default_factory=dict)
    seq: int = 0

    def fold(self, batches: Iterable[ChangeBatch], check: Callable[[ChangeBatch], None]) -> None:
        """Fold in `batches`, each first checked as a room checks it (`check` raises
        UnappliableBatchError for one every process skips: left out, its number kept)."""
        for batch in batches:
            try:
                check(batch)
            except UnappliableBatchError:
                self.seq = max(self.seq, batch.seq)
                continue
            self.add(batch)

    def add(self, batch: ChangeBatch) -> None:
        for change in batch.puts:
            self._put(change)
        for withdrawal in batch.withdrawals:
            self.withdrawn[withdrawal.item_id] = withdrawal
        self.seq = max(self.seq, batch.seq)

    def _put(self, change: ItemChange) -> None:
        earlier = self.puts.get(change.item_id)
        if change.vector_only:
            # Only the vector moves; whether it is withdrawn stays as it was.
            if earlier is None:
                self.puts[change.item_id] = change
            else:
                self.puts[change.item_id] = dataclasses.replace(earlier, embedding=change.embedding)
            return
        self.puts[change.item_id] = change
        self.withdrawn.pop(change.item_id, None)  # a put brings a withdrawn item back

    def batches(self) -> list[ChangeBatch]:
        """The fold as batches of the log, all numbered with its last batch's number: full
        puts first, then the refits of items it holds no put of, then the withdrawals."""
        puts = sorted(self.puts.values(), key=lambda change: change.vector_only)
        withdrawals = list(self.withdrawn.values())
        parts = [
            ChangeBatch(self.seq, tuple(puts[start : start + PART_CHANGES]))
            for start in range(0, len(puts), PART_CHANGES)
        ]
        parts += [
            ChangeBatch(self.seq, (), tuple(withdrawals[start : start + PART_CHANGES]))
            for start in range(0, len(withdrawals), PART_CHANGES)
        ]
        return parts or [ChangeBatch(self.seq)]


def fold(batches: Iterable[ChangeBatch], check: Callable[[ChangeBatch], None]) -> Fold:
    """The batches folded, each first checked as a room checks it (`check` raises
    UnappliableBatchError for one to leave out)."""
    folded = Fold()
    folded.fold(batches, check)
    return folded
