"""A batch of the event log's entries, sorted: each user's events in the order they came,
and the events that cannot be applied set aside with why. Pure: no Redis, no clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from app.clients.event_stream import Entry, SetAside
from app.core.events import Event, MalformedEventError, decode_entry, keyable_user
from app.core.ingest_metrics import DeadLetter
from app.core.vocabulary import Positions

# Catalog positions of item ids, -1 for an id the catalog does not hold.
Lookup = Callable[[list[str]], Positions]


@dataclass(slots=True)
class Sorted:
    """A batch's entries: the events of each user in order, and those set aside."""

    by_user: dict[str, list[tuple[Event, int]]]
    dead: list[SetAside]
    entry_of: dict[int, bytes]  # by id() of each decoded event: to set a user's aside

    def entries_of(self, user_id: str) -> set[bytes]:
        return {self.entry_of[id(event)] for event, _ in self.by_user[user_id]}


def split_stale(
    entries: list[Entry], stale_before_ms: float | None
) -> tuple[list[Entry], list[SetAside]]:
    """A redelivered entry older than the dedupe window may have applied already, its
    ids since forgotten: set aside, never applied twice. None: the entries are not
    redelivered, and none is stale."""
    if stale_before_ms is None:
        return entries, []
    fresh = [entry for entry in entries if entry.ms >= stale_before_ms]
    why = "pending longer than RECSYS_EVENT_DEDUPE_S: it may have applied already"
    stale = [
        SetAside(entry.entry_id, entry.fields, DeadLetter.STALE, why)
        for entry in entries
        if entry.ms < stale_before_ms
    ]
    return fresh, stale


def sort_batch(entries: list[Entry], lookup: Lookup) -> Sorted:
    """Each user's events, decoded and placed in the catalog; the rest set aside."""
    by_user: dict[str, list[tuple[Event, int]]] = {}
    dead: list[SetAside] = []
    decoded: list[tuple[bytes, Event]] = []
    for entry in entries:
        try:
            events = decode_entry(entry.fields)
        except MalformedEventError as exc:
            dead.append(SetAside(entry.entry_id, entry.fields, DeadLetter.MALFORMED, str(exc)))
            continue
        for event in events:
            if isinstance(event, MalformedEventError):
                kept = {b"event": str(event).encode()}
                dead.append(SetAside(entry.entry_id, kept, DeadLetter.MALFORMED, str(event)))
            elif not keyable_user(event.user_id):
                why = "a user id with { or } cannot tag its keys"
                dead.append(SetAside(entry.entry_id, _kept(event), DeadLetter.BAD_USER_ID, why))
            else:
                decoded.append((entry.entry_id, event))
    positions = lookup([event.item_id for _, event in decoded])
    for (entry_id, event), position in zip(decoded, positions.tolist(), strict=True):
        if position < 0:
            why = "the catalog has no such item"
            dead.append(SetAside(entry_id, _kept(event), DeadLetter.UNKNOWN_ITEM, why))
        else:
            by_user.setdefault(event.user_id, []).append((event, position))
    return Sorted(by_user, dead, {id(event): entry_id for entry_id, event in decoded})


def set_aside(
    batch: Sorted, events: list[tuple[Event, int]], reason: DeadLetter, why: str
) -> list[SetAside]:
    """These events of the batch, set aside for `reason`."""
    return [SetAside(batch.entry_of[id(event)], _kept(event), reason, why) for event, _ in events]


def _kept(event: Event) -> dict[bytes, bytes]:
    return {b"event": json.dumps(event.to_json()).encode()}
