"""What a user did, as the events API takes it and the event stream carries it.

The API appends events to a Redis Stream; the ingest consumer (app.ingest) reads them back.
Both sides speak these types, and a stream entry is the flat field map `to_fields` makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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


class IngestOutcome(StrEnum):
    """What the consumer did with an event it read (a metric label: a fixed set)."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # its event id was applied before: a retried batch
    DEAD_LETTER = "dead_letter"  # could not be applied: moved aside with its reason


@dataclass(frozen=True, slots=True)
class Event:
    event_id: str
    user_id: str
    item_id: str
    type: EventType
    ts_ms: int
    value: float | None = None
    request_id: str | None = None

    @property
    def positive(self) -> bool:
        if self.type is EventType.RATING:
            return self.value is not None and self.value >= POSITIVE_RATING
        return self.type in POSITIVE_TYPES

    @property
    def consumed(self) -> bool:
        """The user has had the item (anything but a bare impression): it is seen at once."""
        return self.type is not EventType.IMPRESSION

    def to_fields(self) -> dict[str, str]:
        fields = {
            "e": self.event_id,
            "u": self.user_id,
            "i": self.item_id,
            "t": self.type.value,
            "ts": str(self.ts_ms),
        }
        if self.value is not None:
            fields["v"] = repr(self.value)
        if self.request_id is not None:
            fields["r"] = self.request_id
        return fields


class MalformedEventError(ValueError):
    """A stream entry that is not an event this service wrote."""


def _text(fields: dict[bytes, bytes], key: bytes) -> str:
    value = fields.get(key)
    if value is None:
        raise MalformedEventError(f"no field {key.decode()}")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise MalformedEventError(f"field {key.decode()} is not UTF-8") from exc


def from_fields(fields: dict[bytes, bytes]) -> Event:
    """The event a stream entry holds; MalformedEventError naming what is wrong."""
    try:
        kind = EventType(_text(fields, b"t"))
    except ValueError as exc:
        raise MalformedEventError(f"unknown event type ({exc})") from exc
    try:
        ts_ms = int(_text(fields, b"ts"))
        value = float(_text(fields, b"v")) if b"v" in fields else None
    except ValueError as exc:
        raise MalformedEventError(f"bad number ({exc})") from exc
    if value is not None and value != value:
        raise MalformedEventError("value is NaN")
    return Event(
        event_id=_text(fields, b"e"),
        user_id=_text(fields, b"u"),
        item_id=_text(fields, b"i"),
        type=kind,
        ts_ms=ts_ms,
        value=value,
        request_id=_text(fields, b"r") if b"r" in fields else None,
    )
