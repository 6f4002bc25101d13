"""What a user did, as the events API takes it and the event stream carries it.

The API appends events to a Redis Stream; the ingest consumer (app.ingest) reads them back.
Both sides speak these types; a stream entry is what `encode_entry` makes of a batch.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.core.storable import fits_int64, identifier_problem


class EventType(StrEnum):
    IMPRESSION = "impression"
    CLICK = "click"
    LIKE = "like"
    DISLIKE = "dislike"
    PURCHASE = "purchase"
    RATING = "rating"


# A rating at least this high is a positive, like a click; below it, a dislike.
POSITIVE_RATING = 4.0
# Events that say the user wants the item: they enter the user's history and taste.
POSITIVE_TYPES = frozenset({EventType.CLICK, EventType.LIKE, EventType.PURCHASE})
# Events that credit the answer they came from (by request id) to its variant.
CREDITED_TYPES = frozenset({EventType.CLICK, EventType.LIKE, EventType.PURCHASE})


class EventOutcome(StrEnum):
    """What became of an event posted to /events (a metric label: a fixed set)."""

    ACCEPTED = "accepted"
    UNKNOWN_ITEM = "unknown_item"  # the catalog has no such item: counted, never applied
    FUTURE = "future"  # stamped too far ahead of the clock: counted, never applied
    STALE = "stale"  # stamped further back than the configured bound: counted, never applied


class IngestOutcome(StrEnum):
    """What the consumer did with an event it read (a metric label: a fixed set)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # its event id was applied before: a retried batch
    DEAD_LETTER = "dead_letter"  # could not be applied: moved aside with its reason


# An answer's id is the service's: 128 random bits, made per answer. Its variant is noted
# under it, so an event can credit only an answer the service gave, and no client id can
# name (or overwrite) another answer's note.
_ANSWER_ID = re.compile(r"^[0-9a-f]{32}$")


def new_answer_id() -> str:
    return secrets.token_hex(16)


def is_answer_id(text: str) -> bool:
    return _ANSWER_ID.match(text) is not None


def keyable_user(user_id: str) -> bool:
    """Whether a user id can be the hash tag of its keys (`recsys:u:{id}`): a brace in it
    would end the tag early or leave it empty, and a user's keys would fall apart across a
    Redis Cluster's slots."""
    return "{" not in user_id and "}" not in user_id


@dataclass(frozen=True, slots=True)
class Event:
    event_id: str
    user_id: str
    item_id: str
    type: EventType
    ts_ms: int
    value: float | None = None
    answer_id: str | None = None  # the answer it came from, as the service issued its id

    @property
    def positive(self) -> bool:
        if self.type is EventType.RATING:
            return self.value is not None and self.value >= POSITIVE_RATING
        return self.type in POSITIVE_TYPES

    def to_json(self) -> dict[str, Any]:
        compact: dict[str, Any] = {
            "e": self.event_id,
            "u": self.user_id,
            "i": self.item_id,
            "t": self.type.value,
            "ts": self.ts_ms,
        }
        if self.value is not None:
            compact["v"] = self.value
        if self.answer_id is not None:
            compact["r"] = self.answer_id
        return compact


class MalformedEventError(ValueError):
    """A stream entry that is not an event this service wrote."""


# A stream entry holds a batch's events of one partition, as one JSON array: one XADD a
# batch instead of one an event, where the client's cost per command is what counts.
EVENTS_FIELD = b"events"


def encode_entry(events: Sequence[Event]) -> dict[str, str]:
    return {EVENTS_FIELD.decode(): json.dumps([e.to_json() for e in events], separators=(",", ":"))}


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise MalformedEventError(f"{name} is not a string")
    return value


def _storable(event: Event) -> Event:
    """The event, if the consumer can store what it names: its ids name Redis keys (valid
    Unicode) and its time fits the int64 it is kept in. (The archive keeps rows that fail
    apart, with why: app.archive.quarantine.)"""
    if event.ts_ms < 0 or not fits_int64(event.ts_ms):
        raise MalformedEventError("ts is past what an int64 holds")
    for name, text in (("e", event.event_id), ("u", event.user_id), ("i", event.item_id)):
        problem = identifier_problem(text)
        if problem is not None:
            raise MalformedEventError(f"{name} {problem}")
    return event


def from_json(raw: Any) -> Event:
    """One event of an entry; MalformedEventError naming what is wrong."""
    if not isinstance(raw, dict):
        raise MalformedEventError("an event is not an object")
    try:
        kind = EventType(_text(raw.get("t"), "t"))
    except ValueError as exc:
        raise MalformedEventError(f"unknown event type ({exc})") from exc
    ts_ms, value = raw.get("ts"), raw.get("v")
    if not isinstance(ts_ms, int) or isinstance(ts_ms, bool):
        raise MalformedEventError("ts is not an integer")
    if value is not None and (
        not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
    ):
        raise MalformedEventError("value is not a finite number")
    answer_id = raw.get("r")
    return Event(
        event_id=_text(raw.get("e"), "e"),
        user_id=_text(raw.get("u"), "u"),
        item_id=_text(raw.get("i"), "i"),
        type=kind,
        ts_ms=ts_ms,
        value=None if value is None else float(value),
        answer_id=None if answer_id is None else _text(answer_id, "r"),
    )


def decode_entry(fields: dict[bytes, bytes]) -> list[Event | MalformedEventError]:
    """The events a stream entry holds, each one or why it cannot be read; an entry that is
    not one this service wrote is MalformedEventError itself."""
    raw = fields.get(EVENTS_FIELD)
    if raw is None:
        raise MalformedEventError("no events field")
    try:
        batch = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # nested past the parser's depth
        raise MalformedEventError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(batch, list):
        raise MalformedEventError("events is not a list")
    decoded: list[Event | MalformedEventError] = []
    for each in batch:
        try:
            decoded.append(_storable(from_json(each)))
        except (MalformedEventError, ArithmeticError) as exc:  # an int no float holds
            shown = json.dumps(each)[:300]
            decoded.append(MalformedEventError(f"{exc}: {shown}"))
    return decoded
