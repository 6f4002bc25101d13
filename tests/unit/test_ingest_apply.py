"""What a user's new events change, without Redis (app.ingest.apply)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.core.events import Event, EventType
from app.core.vocabulary import Positions
from app.ingest.apply import UserState, change_for


def _state(
    positives: Sequence[int] = (),
    seen: Sequence[int] = (),
    impressions: dict[int, int] | None = None,
    applied: frozenset[str] = frozenset(),
) -> UserState:
    return UserState(
        positives=np.asarray(positives, dtype=np.int64),
        positives_stored=True,
        seen=np.asarray(seen, dtype=np.int64),
        blob=None,
        impressions=impressions or {},
        applied=applied,
    )


def _event(
    n: int, kind: EventType, value: float | None = None, answer_id: str | None = None
) -> Event:
    return Event(f"e{n}", "u1", f"i{n}", kind, 1_000 * n, value, answer_id)


folded: list[list[int]] = []


def _refold(positives: Positions, blob: object) -> np.ndarray:
    folded.append(positives.tolist())
    return np.full(3, float(len(positives)), dtype=np.float32)


def test_a_click_makes_the_item_seen_and_a_positive_and_folds_the_vector_in() -> None:
    folded.clear()
    change = change_for(
        _state(positives=[1], seen=[1]), [(_event(1, EventType.CLICK), 5)], 3, _refold
    )
    assert change.seen == [5]
    assert change.positives == [5]
    assert folded == [[1, 5]]  # the whole history, the new positive last
    assert change.blob is not None
    assert change.blob.tolist() == [2.0, 2.0, 2.0]
    assert change.trending == [(5, 1_000)]
    assert change.applied == ["e1"]


def test_an_event_applied_before_or_twice_in_a_batch_changes_nothing() -> None:
    events = [
        (_event(1, EventType.LIKE), 5),
        (_event(1, EventType.LIKE), 5),
        (_event(2, EventType.LIKE), 6),
    ]
    change = change_for(_state(applied=frozenset({"e2"})), events, 3, _refold)
    assert change.applied == ["e1"]
    assert change.duplicates == 2
    assert change.positives == [5]


def test_impressions_make_an_item_seen_after_the_count_unless_chosen() -> None:
    shown = [(_event(n, EventType.IMPRESSION), 9) for n in range(3)]
    change = change_for(_state(impressions={9: 1}), shown[:1], 3, _refold)
    assert change.impressions == {9: 2}
    assert change.seen == []
    change = change_for(_state(impressions={9: 1}), shown[:2], 3, _refold)
    assert change.impressions == {9: 3}
    assert change.seen == [9]
    chosen = change_for(_state(positives=[9], seen=[9], impressions={9: 5}), shown[:1], 3, _refold)
    assert chosen.seen == []
    never = change_for(_state(impressions={9: 50}), shown[:1], 0, _refold)
    assert never.seen == []
    assert never.blob is None  # impressions alone leave the vector as it was


def test_a_low_rating_or_a_dislike_is_seen_but_not_a_positive() -> None:
    events = [(_event(1, EventType.RATING, 2.0), 4), (_event(2, EventType.DISLIKE), 6)]
    change = change_for(_state(), events, 3, _refold)
    assert change.seen == [4, 6]
    assert change.positives == []
    assert change.blob is None
    high = change_for(_state(), [(_event(3, EventType.RATING, 4.5), 7)], 3, _refold)
    assert high.positives == [7]


def test_a_click_naming_its_answer_credits_it() -> None:
    events = [
        (_event(1, EventType.CLICK, answer_id="r1"), 2),
        (_event(2, EventType.IMPRESSION, answer_id="r1"), 3),
    ]
    change = change_for(_state(), events, 3, _refold)
    assert change.credits == [("r1", EventType.CLICK)]


def test_the_vector_is_folded_in_from_the_latest_positives_kept() -> None:
    folded.clear()
    events = [(_event(n, EventType.CLICK), 100 + n) for n in range(3)]
    change_for(_state(positives=list(range(10)), seen=[]), events, 3, _refold, positives_kept=5)
    assert folded == [[8, 9, 100, 101, 102]]
