"""An event log entry as the consumer reads it: anything a hostile writer puts there is a
MalformedEventError for that event (set aside, counted), never an exception that stops the
batch (app.core.events.decode_entry)."""

from __future__ import annotations

import json

import pytest

from app.core.events import MalformedEventError, decode_entry

GOOD = {"e": "e1", "u": "u1", "i": "i1", "t": "click", "ts": 1_700_000_000_000}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({**GOOD, "ts": 2**63}, "int64"),
        ({**GOOD, "u": "u\ud800"}, "Unicode"),
        ({**GOOD, "t": "rating", "v": 10**400}, "float"),
        ({**GOOD, "v": float("inf")}, "finite"),
    ],
)
def test_an_event_no_key_or_column_can_hold_is_malformed_and_the_others_read(
    bad: dict[str, object], why: str
) -> None:
    first, refused, last = decode_entry({b"events": json.dumps([GOOD, bad, GOOD]).encode()})
    assert not isinstance(first, MalformedEventError)
    assert not isinstance(last, MalformedEventError)
    assert isinstance(refused, MalformedEventError)
    assert why in str(refused)


def test_an_entry_nested_past_the_parsers_depth_is_malformed() -> None:
    with pytest.raises(MalformedEventError, match="not JSON"):
        decode_entry({b"events": b"[" * 100_000 + b"]" * 100_000})
