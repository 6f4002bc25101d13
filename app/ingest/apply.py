"""What one user's new events change: pure logic, the state read and written elsewhere.

In the order they came, each event not applied before:
- anything but an impression makes the item seen at once (it is no longer recommended);
- an impression counts; the item becomes seen after `impressions_to_seen` of them unless
  the user chose it;
- a positive (click, like, purchase, a rating of 4 or more) joins the user's positives, and
  the user's vector is folded in again from all of them; the activity features follow;
- a positive counts toward the item's trending score, and credits the answer it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.core.events import CREDITED_TYPES, Event, EventType
from app.core.vocabulary import Positions

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class UserState:
    """What Redis holds about the user, as far as their new events touch it."""

    positives: Positions  # oldest first; the world's history when none were stored yet
    positives_stored: bool  # False: `positives` came from the seen list, to be written whole
    seen: Positions
    blob: FloatArray | None  # None: no stored features (a new user)
    impressions: dict[int, int]  # by item position: impressions without a choice so far
    applied: frozenset[str]  # the ids of this user's events applied before
    applied_kept: int = 0  # how many applied ids are kept now (they start afresh when many)
    world_user: bool = True  # the world holds the user: their state never expires


@dataclass(slots=True)
class UserChange:
    seen: list[int] = field(default_factory=list)  # to append to the seen list
    positives: list[int] = field(default_factory=list)  # to append to the positives
    impressions: dict[int, int] = field(default_factory=dict)  # new counts by position
    blob: FloatArray | None = None  # the new blob, when the vector was folded in again
    applied: list[str] = field(default_factory=list)  # event ids applied now
    duplicates: int = 0  # events applied before, or twice in the batch
    trending: list[tuple[int, int]] = field(default_factory=list)  # (position, ts ms)
    credits: list[tuple[str, EventType]] = field(default_factory=list)  # (request id, type)

    @property
    def writes(self) -> bool:
        return bool(self.applied)


# The user's vector and dense features from their positives and the old blob.
Refold = Callable[[Positions, FloatArray | None], FloatArray]


def change_for(
    state: UserState,
    events: Sequence[tuple[Event, int]],
    impressions_to_seen: int,
    refold: Refold,
    positives_kept: int = 0,
) -> UserChange:
    """The change `events` (each with its item's catalog position), in order, make; the
    vector is folded in from the latest `positives_kept` positives (0: all of them)."""
    change = UserChange()
    seen = set(state.seen.tolist())
    chosen = set(state.positives.tolist())
    applied = set(state.applied)
    for event, position in events:
        if event.event_id in applied:
            change.duplicates += 1
            continue
        applied.add(event.event_id)
        change.applied.append(event.event_id)
        if event.type is EventType.IMPRESSION:
            count = change.impressions.get(position, state.impressions.get(position, 0)) + 1
            change.impressions[position] = count
            if impressions_to_seen and count >= impressions_to_seen and position not in chosen:
                _see(position, seen, change)
            continue
        _see(position, seen, change)
        if event.positive:
            chosen.add(position)
            change.positives.append(position)
            change.trending.append((position, event.ts_ms))
            if event.answer_id is not None and event.type in CREDITED_TYPES:
                change.credits.append((event.answer_id, event.type))
    if change.positives:
        history = np.concatenate([state.positives, np.asarray(change.positives, dtype=np.int64)])
        change.blob = refold(history[-positives_kept:] if positives_kept else history, state.blob)
    return change


def _see(position: int, seen: set[int], change: UserChange) -> None:
    if position not in seen:
        seen.add(position)
        change.seen.append(position)
