"""The cascade's in-process steps: the similar source, pre-rank, the sequence signals."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from app.clients.feature_store import decode_user, encode_seen
from app.core.errors import ConfigError, FailureKind, FeatureStoreError
from app.core.metrics import ServiceMetrics
from app.pipeline.context import RequestContext
from app.pipeline.packing import pack_rows
from app.pipeline.signals import SIGNALS, prerank_signals, sequence_columns
from app.pipeline.sources.similar import SimilarSource
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.pack import RowPacker
from app.pipeline.stages.prerank import PreRanker
from app.pipeline.taken import Taken
from app.pipeline.types import (
    Asked,
    Hydrated,
    HydratedCandidates,
    Pool,
    Query,
    Recalling,
    UserFeatures,
)
from app.release.artifacts import serving_artifacts
from app.world.layout import PRERANK_FILE
from app.world.neighbours import NOWHERE, Neighbours, load_neighbours, save_neighbours
from app.world.order import NO_TASTE, OrderModel
from app.world.prerank import PrerankWeights, load_prerank
from tests.unit.fakes import KEYS, FakeUserStore, artifacts, user_record
from tests.unit.tiny_schema import tiny_sequence_schema

# Items 0..5 on a line: item n's vector is (1, n / 5); the user points along (1, 0) or (0, 1).
VECTORS = np.stack([np.ones(6), np.arange(6) / 5.0], axis=1).astype(np.float32)
# 0 and 1 are close, 2 is near 3 and 4, 5 is alone.
NEIGHBOURS = Neighbours(
    positions=np.array([[1, -1], [0, -1], [3, 4], [2, 4], [3, 2], [-1, -1]], dtype=np.int32),
    similarity=np.array(
        [[0.9, 0.0], [0.9, 0.0], [0.8, 0.4], [0.8, 0.5], [0.5, 0.4], [0.0, 0.0]],
        dtype=np.float32,
    ),
)


def ctx(
    weights: PrerankWeights | None = None,
    with_vectors: bool = True,
    budget_s: float = 0.1,
    sequence: bool = False,
) -> RequestContext:
    base = artifacts()
    catalog = dataclasses.replace(
        base.catalog,
        vectors=VECTORS if with_vectors else None,
        neighbours=NEIGHBOURS,
        prerank=weights or PrerankWeights(),
    )
    schema = tiny_sequence_schema() if sequence else base.schema
    served = serving_artifacts(schema, catalog, base.rules, base.routing, KEYS)
    return RequestContext(
        request_id="r1",
        deadline=time.monotonic() + budget_s,
        reserve_s=0.01,
        artifacts=served,
        metrics=ServiceMetrics(),
    )


def asked(
    user_vector: tuple[float, float], recent: list[int], decay: float = 0.9, near: bool = True
) -> Asked:
    """A user as the features stage hands them on: the items near their latest positives
    found (unless the world has no neighbours: `near=False`)."""
    blob = np.array([*user_vector, 0.0], dtype=np.float32)
    latest = np.array(recent, np.int64)
    nearby = NEIGHBOURS.around(latest, decay) if near else NOWHERE
    user = UserFeatures(blob, np.zeros(7, np.float32), np.empty(0, np.int64), False, latest, nearby)
    return Asked(Query("u1", 3), user)


def pool(asked: Asked, positions: list[int]) -> Pool:
    return Pool(asked, np.array(positions, dtype=np.int64))


async def test_the_similar_source_recalls_the_latest_items_neighbours_closest_first() -> None:
    source = SimilarSource(count=10)
    recalling = Recalling(asked((1.0, 0.0), recent=[0, 2], decay=0.5), wanted=10)
    # 2 is the latest (weight 1): 3 (0.8) and 4 (0.4); 0 counts half: 1 (0.45). Neither
    # pads (-1) nor any item the sources before found come out.
    found = await source.candidates(recalling, Taken.holding(np.array([4], dtype=np.int64)), ctx())
    assert found.tolist() == [3, 1]  # 4 (0.4) was found before


async def test_the_similar_source_adds_nothing_without_positives_or_neighbours() -> None:
    source = SimilarSource(count=10)
    nobody = Recalling(asked((1.0, 0.0), recent=[]), wanted=10)
    assert len(await source.candidates(nobody, Taken.holding(np.empty(0, np.int64)), ctx())) == 0
    someone = Recalling(asked((1.0, 0.0), recent=[2], near=False), wanted=10)
    assert len(await source.candidates(someone, Taken.holding(np.empty(0, np.int64)), ctx())) == 0


async def test_the_features_stage_finds_what_is_near_the_latest_positives_once() -> None:
    record = user_record()
    store = FakeUserStore(dataclasses.replace(record, recent=np.array([0, 2, 9], np.int64)))
    request = ctx()
    user = (await UserFeatureHydrator(store, 0.02, decay=0.5).run(Query("u1", 3), request)).user
    assert user.recent.tolist() == [0, 2]  # 9 is past this catalog's six items
    assert user.nearby.items.tolist() == [3, 1, 4]
    np.testing.assert_allclose(user.nearby.scores[:3], [0.8, 0.45, 0.4])
    bare = dataclasses.replace(request.artifacts.catalog, neighbours=None)
    request.artifacts = dataclasses.replace(request.artifacts, catalog=bare)
    alone = (await UserFeatureHydrator(store, 0.02).run(Query("u1", 3), request)).user
    assert alone.nearby is NOWHERE


async def test_the_features_stage_steps_the_order_model_through_the_latest_positives() -> None:
    rng = np.random.default_rng(2)

    def drawn(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.5, shape).astype(np.float32)

    order = OrderModel(
        drawn(6, 3), drawn(6, 3), drawn(6, 2), drawn(6), drawn(6), drawn(6, 2), drawn(6), 20
    )
    store = FakeUserStore(dataclasses.replace(user_record(), recent=np.array([0, 2, 9], np.int64)))
    request = ctx()
    request.artifacts = dataclasses.replace(
        request.artifacts, catalog=dataclasses.replace(request.artifacts.catalog, order=order)
    )
    user = (await UserFeatureHydrator(store, 0.02).run(Query("u1", 3), request)).user
    np.testing.assert_array_equal(user.taste.state, order.state(np.array([0, 2], np.int64)))
    # An item page's viewed item is the latest step of all.
    page = Query("u1", 3, viewed_item_id=str(request.artifacts.catalog.item_ids[5]))
    viewing = (await UserFeatureHydrator(store, 0.02).run(page, request)).user
    np.testing.assert_array_equal(viewing.taste.state, order.state(np.array([0, 2, 5], np.int64)))
    # The store down: no positives to step through, no taste.
    down = FakeUserStore(error=FeatureStoreError(FailureKind.TIMEOUT, "down"))
    broken = (await UserFeatureHydrator(down, 0.02).run(Query("u1", 3), request)).user
    assert broken.taste is NO_TASTE


def test_the_signals_are_the_users_vector_the_neighbours_and_the_latest_items() -> None:
    positions = np.array([1, 3, 5], dtype=np.int64)
    user = np.array([0.0, 1.0], dtype=np.float32)
    latest = np.array([2], np.int64)
    near = NEIGHBOURS.around(latest, 0.9)
    signals = prerank_signals(positions, user, latest, VECTORS, near, 0.9)
    assert SIGNALS == (
        "user",
        "similar",
        "recent",
        "recent_max",
        "recent_mean",
        "recent_category",
        "order",
    )
    # A world without an order model: its column is 0 for every candidate.
    np.testing.assert_array_equal(signals[:, 6], 0.0)
    np.testing.assert_allclose(signals[:, 0], [0.2, 0.6, 1.0], atol=1e-3)
    np.testing.assert_allclose(signals[:, 1], [0.0, 0.8, 0.0], atol=1e-6)
    # Item 2's vector is (1, 0.4): item n scores 1 + 0.4 n / 5.
    np.testing.assert_allclose(signals[:, 2], [1.08, 1.24, 1.4], atol=2e-3)
    # One latest positive: its best and its mean similarity are that one's.
    np.testing.assert_allclose(signals[:, 3], signals[:, 2], atol=1e-6)
    np.testing.assert_allclose(signals[:, 4], signals[:, 2], atol=1e-6)
    two = prerank_signals(positions, user, np.array([2, 0], np.int64), VECTORS, near, 0.5)
    each = VECTORS[positions] @ VECTORS[[2, 0]].T
    np.testing.assert_allclose(two[:, 3], each.max(axis=1), atol=1e-6)
    np.testing.assert_allclose(two[:, 4], each.mean(axis=1), atol=1e-6)
    # Recency: the later positive (item 0) weighs twice the earlier at decay 0.5.
    np.testing.assert_allclose(two[:, 2], each @ [1 / 3, 2 / 3], atol=1e-5)
    # Without categories that column stays 0; with them, the recency-weighted share of the
    # latest positives in the candidate's category.
    assert (two[:, 5] == 0).all()
    categories = np.array([7, 7, 8, 8, 8, 9], np.int64)  # item 2 in 8, item 0 in 7
    sharing = prerank_signals(
        positions, user, np.array([2, 0], np.int64), VECTORS, near, 0.5, categories
    )
    # Items 1 (7), 3 (7) and 5 (9): the later positive's category, the earlier's, neither.
    np.testing.assert_allclose(sharing[:, 5], [2 / 3, 1 / 3, 0.0], atol=1e-6)
    np.testing.assert_allclose(sharing[:, :5], two[:, :5])
    # Pre-rank over the whole pool computes its own columns only (WEIGHED and ORDER).
    weighed = prerank_signals(
        positions, user, np.array([2, 0], np.int64), VECTORS, near, 0.5, categories, True
    )
    np.testing.assert_allclose(weighed[:, :3], two[:, :3])
    assert (weighed[:, 3:] == 0).all()
    alone = prerank_signals(positions, user, np.empty(0, np.int64), VECTORS, NOWHERE, 0.9)
    assert (alone[:, 1:] == 0).all()


async def test_pre_rank_keeps_the_best_by_the_worlds_weights_best_first() -> None:
    weights = PrerankWeights(user=0.0, similar=1.0, recent=0.0)
    stage = PreRanker(keep=2, decay=0.9)
    kept = await stage.run(pool(asked((1.0, 0.0), [2]), [5, 4, 1, 3]), ctx(weights))
    assert kept.positions.tolist() == [3, 4]  # similarity 0.8, then 0.4
    by_vector = await stage.run(pool(asked((0.0, 1.0), [2]), [1, 4, 3, 5]), ctx())
    assert by_vector.positions.tolist() == [5, 4]


async def test_a_pool_no_larger_than_the_cut_passes_as_it_came() -> None:
    stage = PreRanker(keep=4, decay=0.9)
    same = await stage.run(pool(asked((0.0, 1.0), []), [1, 5, 3]), ctx())
    assert same.positions.tolist() == [1, 5, 3]


async def test_without_vectors_or_time_pre_rank_keeps_recall_order() -> None:
    stage = PreRanker(keep=2, decay=0.9)
    request = asked((0.0, 1.0), [])
    plain = ctx(with_vectors=False)
    kept = await stage.run(pool(request, [1, 2, 5]), plain)
    assert kept.positions.tolist() == [1, 2]
    assert plain.degraded == []
    late = ctx(budget_s=0.0)
    kept = await stage.run(pool(request, [1, 2, 5]), late)
    assert kept.positions.tolist() == [1, 2]
    assert late.degraded == ["prerank:timeout"]


async def test_the_packer_fills_the_sequence_block_the_schema_declares() -> None:
    request = ctx(sequence=True)
    schema = request.artifacts.schema
    user = asked((1.0, 0.0), [2])
    items = HydratedCandidates(
        positions=np.array([1, 3, 5], np.int64),
        found=np.array([1, 2], np.intp),
        blobs=np.array([[1.0, 0.6, 3.0], [1.0, 1.0, 5.0]], np.float32),
    )
    packed = await RowPacker(0.9).run(Hydrated(user, items), request)
    block = packed.rows[:, schema.blocks["sequence"]]
    expected = prerank_signals(
        np.array([3, 5], np.int64),
        user.user.blob[:2],
        user.user.recent,
        VECTORS,
        user.user.nearby,
        0.9,
    )
    np.testing.assert_allclose(block, sequence_columns(schema, expected))
    assert block[0, 0] == pytest.approx(0.8)  # item 3 is item 2's closest neighbour
    with pytest.raises(ValueError, match="sequence"):
        pack_rows(schema, user.user.blob, items.blobs, np.zeros(7, np.float32))


def test_the_users_latest_positives_come_from_the_tail_of_their_list() -> None:
    blob = np.zeros(3, np.float32).tobytes()
    record = decode_user(blob, encode_seen([1, 2]), 3, encode_seen([4, 5]))
    assert record.recent.tolist() == [4, 5]
    assert decode_user(blob, None, 3, None).recent.tolist() == []


def test_neighbours_are_checked_as_stored_before_any_cast(tmp_path: Path) -> None:
    similarity = NEIGHBOURS.similarity
    # 2**32 + 1 would wrap to position 1 as int32: in range, and wrong.
    wrapped = NEIGHBOURS.positions.astype(np.int64)
    wrapped[0, 0] = 2**32 + 1
    np.savez(tmp_path / "neighbours.npz", positions=wrapped, similarity=similarity)
    with pytest.raises(ConfigError, match="past the catalog"):
        load_neighbours(tmp_path, 6)
    floats = NEIGHBOURS.positions.astype(np.float64) + 0.5  # would truncate into range
    np.savez(tmp_path / "neighbours.npz", positions=floats, similarity=similarity)
    with pytest.raises(ConfigError, match="integers and floats expected"):
        load_neighbours(tmp_path, 6)
    huge = similarity.astype(np.float64)
    huge[0, 0] = 1e300  # finite as stored, Inf as served
    np.savez(tmp_path / "neighbours.npz", positions=NEIGHBOURS.positions, similarity=huge)
    with pytest.raises(ConfigError, match="past float32's"):
        load_neighbours(tmp_path, 6)
    wide = NEIGHBOURS.positions.astype(np.int64)
    np.savez(tmp_path / "neighbours.npz", positions=wide, similarity=similarity)
    loaded = load_neighbours(tmp_path, 6)
    assert loaded is not None
    assert loaded.positions.dtype == np.int32
    assert np.array_equal(loaded.positions, NEIGHBOURS.positions)


def test_a_damaged_neighbours_or_weights_file_is_refused(tmp_path: Path) -> None:
    save_neighbours(tmp_path, NEIGHBOURS)
    assert load_neighbours(tmp_path, 6) is not None
    with pytest.raises(ConfigError, match="catalog of 7"):
        load_neighbours(tmp_path, 7)
    assert load_neighbours(tmp_path / "none", 6) is None
    whole = (tmp_path / "neighbours.npz").read_bytes()
    (tmp_path / "neighbours.npz").write_bytes(whole[: len(whole) // 2])  # a copy cut short
    with pytest.raises(ConfigError, match="cannot be read"):
        load_neighbours(tmp_path, 6)
    assert load_prerank(tmp_path) == PrerankWeights()
    (tmp_path / PRERANK_FILE).write_text(
        json.dumps({"user": 1, "similar": float("nan"), "recent": 0})
    )
    with pytest.raises(ConfigError, match="NaN"):
        load_prerank(tmp_path)
