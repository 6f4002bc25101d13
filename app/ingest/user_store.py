"""Users' real-time state, as the consumer reads and writes it: what the scripts are asked
and what their replies mean. The calls themselves (keys, groups, Redis) are
app.clients.user_state's.

State stays bounded: a user's positives and seen list keep their latest entries only, the
ids of applied events start afresh once they are many, and a user the world did not hold
(made by their events) is forgotten after an idle time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.clients.feature_store import FLOAT32, SEEN_POSITION, decode_seen, encode_seen
from app.clients.user_state import ScriptCall, UserStateScripts
from app.core.events import Event, EventType
from app.ingest.apply import UserChange, UserState
from app.ingest.world import IngestWorld

# Event ids kept per user for spotting a retried event: past this many they start afresh.
APPLIED_IDS_KEPT = 1024
# Fields of a user's reply before the impression counts and applied marks.
_FIXED = 5


@dataclass(frozen=True, slots=True)
class Bounds:
    dedupe_s: int  # how long applied ids are kept
    positives: int  # the latest positives kept
    seen: int  # the latest seen items kept
    online_ttl_s: int  # a user made by events lives this long without one; 0: for good


class UserStore:
    def __init__(self, scripts: UserStateScripts, bounds: Bounds) -> None:
        self._scripts = scripts
        self._bounds = bounds

    @property
    def positives_kept(self) -> int:
        return self._bounds.positives

    async def states(
        self, by_user: dict[str, list[tuple[Event, int]]], world: IngestWorld
    ) -> dict[str, UserState | str]:
        """Each user's state (a string says why it cannot be used)."""
        asked: list[tuple[str, list[int], list[str]]] = []
        for user_id, events in by_user.items():
            shown = sorted({p for e, p in events if e.type is EventType.IMPRESSION})
            asked.append((user_id, shown, [event.event_id for event, _ in events]))
        groups = self._scripts.groups(asked)
        replies = await self._scripts.read([_read_call(group) for group in groups])
        states: dict[str, UserState | str] = {}
        for group, reply in zip(groups, replies, strict=True):
            at = 0
            for user_id, shown, ids in group:
                fixed = reply[at : at + _FIXED]
                counts = reply[at + _FIXED : at + _FIXED + len(shown)]
                applied = reply[at + _FIXED + len(shown) : at + _FIXED + len(shown) + len(ids)]
                at += _FIXED + len(shown) + len(ids)
                states[user_id] = _state(world, fixed, shown, counts, ids, applied)
        return states

    async def write(self, changes: dict[str, UserChange], states: dict[str, Any]) -> None:
        """Every user's change in one script (atomic, as a transaction)."""
        writing = [(user, change) for user, change in changes.items() if change.writes]
        if writing:
            groups = self._scripts.groups(writing)
            await self._scripts.write([self._write_call(group, states) for group in groups])

    def _write_call(
        self, group: list[tuple[str, UserChange]], states: dict[str, Any]
    ) -> ScriptCall:
        bounds = self._bounds
        width = SEEN_POSITION.itemsize
        args: list[Any] = [bounds.dedupe_s, bounds.positives * width, bounds.seen * width]
        for user_id, change in group:
            args += self._write_args(states[user_id], change)
        return ScriptCall([user_id for user_id, _ in group], args)

    def _write_args(self, state: UserState, change: UserChange) -> list[Any]:
        bounds = self._bounds
        mode, positives = "", b""
        if change.positives and state.positives_stored:
            mode, positives = "A", encode_seen(change.positives)
        elif change.positives:
            whole = np.concatenate([state.positives, np.asarray(change.positives)])
            mode, positives = "S", encode_seen(whole[-bounds.positives :])
        blob = b"" if change.blob is None else change.blob.astype(FLOAT32).tobytes()
        counts = [value for pair in change.impressions.items() for value in pair]
        reset = state.applied_kept + len(change.applied) > APPLIED_IDS_KEPT
        args: list[Any] = [encode_seen(change.seen) if change.seen else b"", mode, positives, blob]
        args += [len(change.impressions), *counts]
        args += [int(reset), len(change.applied), *change.applied]
        args.append(0 if state.world_user else bounds.online_ttl_s)
        return args


def _read_call(group: list[tuple[str, list[int], list[str]]]) -> ScriptCall:
    args: list[Any] = []
    for _, shown, ids in group:
        args += [len(shown), *shown, len(ids), *ids]
    return ScriptCall([user_id for user_id, _, _ in group], args)


def _state(
    world: IngestWorld,
    fixed: list[Any],
    shown: list[int],
    counts: Any,
    ids: list[str],
    applied: list[bytes | None],
) -> UserState | str:
    positives_raw, seen_raw, blob_raw, world_user, applied_kept = fixed
    seen, seen_whole = decode_seen(seen_raw)
    positives, positives_whole = decode_seen(positives_raw)
    if not (seen_whole and positives_whole):
        return "a seen list or positives list is torn (not whole uint32 positions)"
    bound = world.catalog_size
    if (seen >= bound).any() or (positives >= bound).any():
        return "a stored list names positions past the catalog"
    blob = None
    if blob_raw is not None:
        if len(blob_raw) != world.blob_width * FLOAT32.itemsize:
            return f"the user blob is {len(blob_raw)} bytes, not {world.blob_width} floats"
        blob = np.frombuffer(blob_raw, dtype=FLOAT32)
        if not np.isfinite(blob).all():
            return "the user blob holds NaN or Inf"
    impressions = {}
    if shown:
        impressions = {p: int(c) for p, c in zip(shown, counts, strict=True) if c is not None}
    return UserState(
        positives=positives if positives_raw is not None else seen,
        positives_stored=positives_raw is not None,
        seen=seen,
        blob=blob,
        impressions=impressions,
        applied=frozenset(i for i, hit in zip(ids, applied, strict=True) if hit is not None),
        applied_kept=int(applied_kept),
        world_user=bool(world_user),
    )
