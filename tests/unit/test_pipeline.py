"""The pipeline's answer and flags for each way a dependency can fail (the table in docs/api.md)."""

from __future__ import annotations

import numpy as np
import pytest

from app.clients.feature_store import BlobState, UserRecord
from app.core.errors import FailureKind, FeatureStoreError, RankingModelError, RecallError
from app.pipeline.stages.features import NOTHING_SEEN
from app.pipeline.types import Query, Recommendation
from tests.unit.fakes import (
    KEYS,
    FakeFallback,
    FakeModel,
    World,
    context,
    item_blob,
    user_record,
)


async def _run(
    world: World, n: int = 3, exclude: frozenset[str] = frozenset()
) -> tuple[Recommendation, list[str]]:
    ctx = context()
    answer = await world.pipeline().run(Query("u1", n, exclude), ctx)
    return answer, ctx.degraded


def _ids(answer: Recommendation) -> list[str]:
    return [item.item_id for item in answer.items]


def _scores(answer: Recommendation) -> list[float | None]:
    return [item.score for item in answer.items]


async def test_all_well_the_model_orders_ann_hits_and_popular_items() -> None:
    answer, degraded = await _run(World(), n=4)
    # Candidates: ANN i3 i4 i5, then the most popular topping up to 4 plus one (i0, i1);
    # the model scores by price.
    assert _ids(answer) == ["i5", "i4", "i3", "i1"]
    assert _scores(answer) == pytest.approx([0.5, 0.4, 0.3, 0.1])
    assert degraded == []
    assert answer.cold_start is False


async def test_seen_and_excluded_items_are_filtered_before_any_feature_read() -> None:
    world = World()
    world.users.record = user_record(seen=[5])
    answer, _ = await _run(world, n=3, exclude=frozenset({"i4"}))
    assert _ids(answer) == ["i3", "i2", "i1"]
    assert KEYS.item("i5").encode() not in world.items.requested
    assert KEYS.item("i4").encode() not in world.items.requested


@pytest.mark.parametrize("kind", [FailureKind.TIMEOUT, FailureKind.UNAVAILABLE])
async def test_user_features_unavailable_cold_start_defaults_and_no_seen_filter(
    kind: FailureKind,
) -> None:
    world = World()
    world.users.error = FeatureStoreError(kind, "down")
    answer, degraded = await _run(world)
    assert degraded == [f"features:{kind}"]
    assert len(answer.items) == 3
    assert answer.cold_start is False


async def test_item_features_unavailable_answers_in_recall_order() -> None:
    world = World()
    world.items.error = FeatureStoreError(FailureKind.CIRCUIT_OPEN, "open")
    answer, degraded = await _run(world, n=4)
    assert degraded == ["fetch:circuit_open"]
    assert _ids(answer) == ["i3", "i4", "i5", "i0"]
    assert _scores(answer) == [None] * 4
    assert world.model.calls == 0


async def test_triton_unavailable_without_fallback_answers_in_recall_order() -> None:
    world = World(model=FakeModel(error=RankingModelError(FailureKind.UNAVAILABLE, "gone")))
    answer, degraded = await _run(world)
    assert degraded == ["rank:unavailable"]
    assert _ids(answer) == ["i3", "i4", "i5"]
    assert _scores(answer) == [None] * 3


@pytest.mark.parametrize(
    "kind", [FailureKind.UNAVAILABLE, FailureKind.OVERLOADED, FailureKind.CIRCUIT_OPEN]
)
async def test_triton_failing_ranks_in_process(kind: FailureKind) -> None:
    world = World(model=FakeModel(error=RankingModelError(kind, "no")), fallback=FakeFallback())
    answer, degraded = await _run(world, n=4)
    assert degraded == [f"rank:{kind}"]
    assert _ids(answer) == ["i5", "i4", "i3", "i1"]
    assert _scores(answer) == pytest.approx([0.5, 0.4, 0.3, 0.1])


async def test_in_process_ranking_short_of_time_scores_what_fits_and_keeps_the_rest() -> None:
    world = World(
        model=FakeModel(error=RankingModelError(FailureKind.TIMEOUT, "slow")),
        fallback=FakeFallback(fits=2),
    )
    answer, degraded = await _run(world, n=4)
    assert degraded == ["rank:timeout"]
    # i3 and i4 were scored; i5 and i0 fill the answer unscored, in recall order.
    assert _ids(answer) == ["i4", "i3", "i5", "i0"]
    assert _scores(answer) == pytest.approx([0.4, 0.3, None, None])


async def test_no_time_at_all_for_in_process_ranking_falls_back_to_recall_order() -> None:
    world = World(
        model=FakeModel(error=RankingModelError(FailureKind.TIMEOUT, "slow")),
        fallback=FakeFallback(fits=0),
    )
    answer, degraded = await _run(world)
    assert degraded == ["rank:timeout"]
    assert _ids(answer) == ["i3", "i4", "i5"]


async def test_recall_failure_answers_from_popular_items() -> None:
    world = World()
    world.search.error = RecallError(FailureKind.OVERLOADED, "queue full")
    answer, degraded = await _run(world)
    assert degraded == ["recall:overloaded"]
    assert _ids(answer) == ["i3", "i2", "i1"]  # popular ones (i0..i3), ranked by the model


async def test_many_items_without_features_are_flagged_and_still_fill_the_answer() -> None:
    world = World()
    for missing in ("i3", "i5"):
        world.items.blobs.pop(KEYS.item(missing).encode())
    answer, degraded = await _run(world, n=4)
    assert degraded == ["fetch:missing"]
    assert _ids(answer) == ["i4", "i1", "i0", "i3"]
    assert _scores(answer) == pytest.approx([0.4, 0.1, 0.0, None])


async def test_a_flushed_redis_still_gives_a_full_flagged_answer() -> None:
    world = World()
    world.users.record = UserRecord(None, BlobState.ABSENT, NOTHING_SEEN)
    world.items.blobs.clear()
    answer, degraded = await _run(world, n=4)
    assert answer.cold_start is True
    assert degraded == ["fetch:missing"]
    assert _ids(answer) == ["i3", "i4", "i5", "i0"]


async def test_item_blobs_with_nan_or_bad_length_are_dropped_and_flagged() -> None:
    world = World()
    nan_blob = np.array([1.0, np.nan, 4.0], np.float32).tobytes()
    world.items.blobs[KEYS.item("i4").encode()] = nan_blob
    world.items.blobs[KEYS.item("i5").encode()] = item_blob(5)[:8]
    answer, degraded = await _run(world, n=2)
    assert degraded == ["fetch:bad_data"]
    assert _ids(answer) == ["i3", "i0"]


async def test_scores_that_are_nan_drop_their_items_and_flag_the_answer() -> None:
    world = World(model=FakeModel(override=np.array([0.3, np.nan, np.inf, 0.1], np.float32)))
    answer, degraded = await _run(world, n=3)  # four candidates: i3 i4 i5 i0
    assert degraded == ["rank:bad_data"]
    assert _ids(answer) == ["i3", "i0"]


@pytest.mark.parametrize(
    "record",
    [
        UserRecord(None, BlobState.MALFORMED, NOTHING_SEEN),
        UserRecord(np.array([np.nan, 0, 1], np.float32), BlobState.PRESENT, NOTHING_SEEN),
    ],
)
async def test_a_bad_user_blob_is_flagged_not_taken_for_a_cold_start(record: UserRecord) -> None:
    world = World()
    world.users.record = record
    answer, degraded = await _run(world)
    assert degraded == ["features:bad_data"]
    assert answer.cold_start is False
    assert len(answer.items) == 3


async def test_each_call_gets_the_time_left_less_the_reserve_capped() -> None:
    world = World()
    await _run(world)
    (timeout,) = world.users.timeouts
    assert 0.0 < timeout <= 0.02  # the 20 ms cap, well inside 100 ms less 10 ms


async def test_a_spent_budget_gives_no_time_to_any_call() -> None:
    ctx = context(budget_s=0.005, reserve_s=0.01)
    assert ctx.time_for(0.02) == 0.0
    assert ctx.time_for() == 0.0


async def test_seen_positions_past_the_catalog_are_dropped_and_flagged() -> None:
    world = World()
    world.users.record = user_record(seen=[5, 4, 99])  # 99: another world's, or garbage
    answer, degraded = await _run(world, n=3)
    assert degraded == ["features:bad_data"]
    assert not {"i4", "i5"} & set(_ids(answer))  # the ones the catalog has still filter
