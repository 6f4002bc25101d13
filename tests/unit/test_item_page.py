"""Item pages and per-page rules: the viewed item's recall, its place among the latest
signals, never in the answer, and each page's own sources and rerank rules."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import faiss
import numpy as np
import pytest

from app.core.errors import ConfigError, FailureKind, FeatureStoreError, RecallError
from app.core.metrics import ServiceMetrics
from app.core.vocabulary import Removal, Viewed
from app.pipeline.context import RequestContext
from app.pipeline.filters.backfill import PopularBackfill
from app.pipeline.filters.viewed import ViewedFilter
from app.pipeline.sources.viewed import ViewedSource
from app.pipeline.stages.features import UserFeatureHydrator
from app.pipeline.stages.filter import CandidateFilter
from app.pipeline.stages.recall import CandidateRecall
from app.pipeline.stages.rerank import Reranker
from app.pipeline.taken import Taken
from app.pipeline.types import (
    Asked,
    ModelUsed,
    Moment,
    Pool,
    Query,
    Ranked,
    Recalling,
    Scored,
    UserFeatures,
)
from app.release.arrivals import ChangeBatch, ItemChange
from app.release.artifacts import ServingArtifacts, serving_artifacts
from app.release.catalog import in_room, with_room
from app.release.rules import (
    DiversityRule,
    ObjectivesRule,
    PageRule,
    PageSources,
    RerankRules,
    load_rules,
)
from app.world.neighbours import Neighbours
from tests.unit.fakes import KEYS, FakeSearch, FakeUserStore, World, artifacts, user_record

# Item n's vector is (1, n / 5): the higher n, the nearer each other's direction.
VECTORS = np.stack([np.ones(6), np.arange(6) / 5.0], axis=1).astype(np.float32)
# Users chose 2 with 4 then 0; 4 with 2; the others with nothing.
NEIGHBOURS = Neighbours(
    positions=np.array([[-1, -1], [-1, -1], [4, 0], [-1, -1], [2, -1], [-1, -1]], np.int32),
    similarity=np.array([[0, 0], [0, 0], [0.8, 0.3], [0, 0], [0.8, 0], [0, 0]], np.float32),
)


def _served(rules: RerankRules | None = None) -> ServingArtifacts:
    base = artifacts()
    catalog = dataclasses.replace(base.catalog, vectors=VECTORS, neighbours=NEIGHBOURS)
    return serving_artifacts(base.schema, catalog, rules or RerankRules(), base.routing, KEYS)


def _ctx(rules: RerankRules | None = None) -> RequestContext:
    return RequestContext("r1", time.monotonic() + 0.1, 0.01, _served(rules), ServiceMetrics())


def _viewing(position: int, page: str = "home", seen: tuple[int, ...] = ()) -> Asked:
    user = UserFeatures(
        np.array([0.0, 1.0, 0.0], np.float32),
        np.zeros(3, np.float32),
        np.array(seen, np.int64),
        False,
        viewed=position,
    )
    return Asked(Query("u1", 3, moment=Moment(page=page)), user)


def _page_count(ctx: RequestContext, page: str, viewed: Viewed) -> float:
    value: float = ctx.metrics.page_requests.labels(page, viewed)._value.get()
    return value


async def test_the_viewed_item_is_the_latest_signal_and_its_neighbours_lead() -> None:
    store = FakeUserStore(record=user_record())
    store.record = dataclasses.replace(store.record, recent=np.array([4, 2], np.int64))
    ctx = _ctx()
    stage = UserFeatureHydrator(store, 0.02)
    query = Query("u1", 3, moment=Moment(page="home"), viewed_item_id="i2")
    user = (await stage.run(query, ctx)).user
    assert user.viewed == 2
    # Moved to the end: the latest of all, counted once.
    np.testing.assert_array_equal(user.recent, [4, 2])
    # 4, chosen with the viewed 2 (0.8), leads 2, chosen with the older 4 (0.8 * 0.9).
    assert user.nearby.items.tolist()[:2] == [4, 2]
    assert _page_count(ctx, "home", Viewed.KNOWN) == 1


async def test_an_unknown_viewed_item_is_ignored_and_counted() -> None:
    ctx = _ctx()
    stage = UserFeatureHydrator(FakeUserStore(), 0.02)
    user = (await stage.run(Query("u1", 3, viewed_item_id="nope"), ctx)).user
    assert user.viewed == -1
    assert len(user.recent) == 0
    assert _page_count(ctx, "other", Viewed.UNKNOWN) == 1
    await stage.run(Query("u1", 3, moment=Moment(page="nowhere")), ctx)
    assert _page_count(ctx, "other", Viewed.NONE) == 1  # a page the schema lacks: other


async def test_the_viewed_item_is_a_signal_even_when_the_store_fails() -> None:
    store = FakeUserStore(error=FeatureStoreError(FailureKind.TIMEOUT, "slow"))
    ctx = _ctx()
    user = (
        await UserFeatureHydrator(store, 0.02).run(Query("u1", 3, viewed_item_id="i4"), ctx)
    ).user
    assert ctx.degraded == ["features:timeout"]
    assert user.viewed == 4
    np.testing.assert_array_equal(user.recent, [4])
    np.testing.assert_array_equal(user.nearby.items, [2])


async def test_viewed_recalls_what_was_chosen_with_it_then_the_nearest_vectors() -> None:
    search = FakeSearch(hits=[2, 5, 4, 3])  # the index, nearest the viewed item's vector
    source = ViewedSource(search, count=3)
    ctx = _ctx()
    found = await source.candidates(Recalling(_viewing(2), 6), Taken.holding(np.array([0])), ctx)
    # 4 (its neighbour); 0 is a neighbour already found; then 5 and 3, never 2 itself.
    assert found.tolist() == [4, 5, 3]
    # A feed asks nothing of it.
    assert (
        len(await source.candidates(Recalling(_viewing(-1), 6), Taken.holding(np.array([0])), ctx))
        == 0
    )


async def test_viewed_falls_back_to_the_neighbours_when_the_search_fails() -> None:
    search = FakeSearch(error=RecallError(FailureKind.ERROR, "index gone"))
    ctx = _ctx()
    found = await ViewedSource(search, count=5).candidates(
        Recalling(_viewing(2), 6), Taken.holding(np.empty(0, np.int64)), ctx
    )
    assert found.tolist() == [4, 0]
    assert ctx.degraded == ["recall:error"]


async def test_the_viewed_item_is_never_in_the_pool_nor_the_backfill() -> None:
    ctx = _ctx()
    stage = CandidateFilter([ViewedFilter()], PopularBackfill())
    asked = dataclasses.replace(_viewing(0), query=Query("u1", 5))
    kept = await stage.run(Pool(asked, np.array([0, 3], np.int64)), ctx)
    assert 0 not in kept.positions.tolist()
    assert len(kept.positions) == 5  # backfilled from popular without it
    assert ctx.metrics.removed_count[Removal.VIEWED]._value.get() == 1


async def test_an_item_page_never_answers_with_its_item() -> None:
    world = World()
    world.search.hits = [5, 4, 3]
    pipeline = world.pipeline(candidates=3)
    ctx = _ctx()
    feed = await pipeline.run(Query("u1", 3), ctx)
    assert "i5" in [item.item_id for item in feed.items]
    page = await pipeline.run(Query("u1", 3, viewed_item_id="i5"), _ctx())
    assert "i5" not in [item.item_id for item in page.items]
    assert len(page.items) == 3


async def test_a_page_sizes_its_sources_and_the_others_keep_the_settings() -> None:
    rules = RerankRules(pages={"home": PageRule(sources=PageSources(ann=2, viewed=1, popular=0))})
    recall = CandidateRecall([ViewedSource(FakeSearch(hits=[3, 5]), 4)], candidate_count=3)
    on_home = await recall.run(_viewing(2, page="home"), _ctx(rules))
    assert on_home.positions.tolist() == [4]
    elsewhere = await recall.run(_viewing(2, page="other"), _ctx(rules))
    assert elsewhere.positions.tolist() == [4, 0, 3, 5]


def test_a_page_section_replaces_the_file_rules_on_that_page_only(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        "[diversity]\nmax_per_category = 2\n"
        "[[boost]]\nname = 'fresh'\nmax_age_days = 3.0\nmultiplier = 1.2\n"
        "[block]\nitem_ids = ['i1']\n"
        "[pages.home.sources]\nviewed = 50\n"
        "[pages.home.diversity]\nmax_per_category = 1\n"
        "[pages.home]\nboost = []\n"
    )
    rules = load_rules(path)
    home = _served(rules).page("home")
    assert home.sources.count("viewed", 300) == 50
    assert home.sources.count("similar", 400) == 400
    assert home.rules.diversity == DiversityRule(max_per_category=1)
    assert home.rules.boost == ()
    assert home.rules.block.item_ids == {"i1"}
    other = _served(rules).page("unheard-of")
    assert other.name == "other"
    assert other.rules.diversity.max_per_category == 2
    assert len(other.rules.boost) == 1


def test_a_section_for_a_page_the_schema_lacks_is_refused(tmp_path: Path) -> None:
    rules = RerankRules(pages={"checkout": PageRule()})
    with pytest.raises(ConfigError, match="checkout"):
        _served(rules)
    path = tmp_path / "rules.toml"
    path.write_text("[pages.home.sources]\nnope = 3\n")
    with pytest.raises(ConfigError, match="nope"):
        load_rules(path)


async def test_items_chosen_with_the_viewed_one_count_more_on_its_page_only() -> None:
    # The model prefers 5, then 3, 4, 0; users chose 4 (0.8) and 0 (0.3) with 2.
    scored = Scored(np.array([5, 3, 4, 0], np.int64), np.array([2.0, 1.5, 1.0, 0.5], np.float32))
    no_rules = RerankRules(boost=())
    page = await Reranker(clock=time.time).run(
        Ranked(_viewing(2), scored, ModelUsed()), _ctx(no_rules)
    )
    # 4, the closest, gains 5 in log-odds (the default weight), 0 gains 5 * 0.3 / 0.8: both
    # pass the model's favourites.
    assert [item.item_id for item in page.items] == ["i4", "i0", "i5"]
    feed = await Reranker(clock=time.time).run(
        Ranked(_viewing(-1), scored, ModelUsed()), _ctx(no_rules)
    )
    assert [item.item_id for item in feed.items] == ["i5", "i3", "i4"]
    weightless = RerankRules(boost=(), objectives=ObjectivesRule(viewed=0.0))
    plain = await Reranker(clock=time.time).run(
        Ranked(_viewing(2), scored, ModelUsed()), _ctx(weightless)
    )
    assert [item.item_id for item in plain.items] == ["i5", "i3", "i4"]


async def test_the_viewed_objective_reads_similarity_as_a_share_of_the_closest() -> None:
    # EASE's weights are a tenth of cosine's: the same rule must move the same items at either
    # scale. The model's order 5, 3, 4, 0; at a fiftieth of the scale too, 4 gains 2 (weight
    # 2, the closest) and 0 gains 2 * 0.3 / 0.8 = 0.75.
    scored = Scored(np.array([5, 3, 4, 0], np.int64), np.array([2.0, 1.5, 1.0, 0.5], np.float32))
    rules = RerankRules(boost=(), objectives=ObjectivesRule(viewed=2.0))
    orders = []
    for scale in (1.0, 0.02):
        neighbours = Neighbours(NEIGHBOURS.positions, NEIGHBOURS.similarity * scale)
        base = artifacts()
        catalog = dataclasses.replace(base.catalog, vectors=VECTORS, neighbours=neighbours)
        served = serving_artifacts(base.schema, catalog, rules, base.routing, KEYS)
        ctx = RequestContext("r1", time.monotonic() + 0.1, 0.01, served, ServiceMetrics())
        page = await Reranker(clock=time.time).run(Ranked(_viewing(2), scored, ModelUsed()), ctx)
        orders.append([item.item_id for item in page.items])
    # 4 (1 + 2) passes 5 (2.0); 0 (0.5 + 0.75) passes neither 3 (1.5) nor 5.
    assert orders == [["i4", "i5", "i3"], ["i4", "i5", "i3"]]


async def test_a_viewed_item_without_neighbours_leaves_the_models_order() -> None:
    scored = Scored(np.array([5, 3, 4, 0], np.int64), np.array([2.0, 1.5, 1.0, 0.5], np.float32))
    page = await Reranker(clock=time.time).run(
        Ranked(_viewing(1), scored, ModelUsed()), _ctx(RerankRules(boost=()))
    )
    assert [item.item_id for item in page.items] == ["i5", "i3", "i4"]


async def test_a_lone_neighbour_is_the_closest_however_weak() -> None:
    # 4's one neighbour, 2 (0.8; the row's other slot is padding): a share of 1, a gain of 5.
    scored = Scored(np.array([5, 3, 2, 0], np.int64), np.array([2.0, 1.5, 0.1, 0.5], np.float32))
    page = await Reranker(clock=time.time).run(
        Ranked(_viewing(4), scored, ModelUsed()), _ctx(RerankRules(boost=()))
    )
    assert [item.item_id for item in page.items] == ["i2", "i5", "i3"]


async def test_a_page_list_serves_the_page_and_the_feeds_list_the_signals() -> None:
    # An EASE build keeps cosine's lists for its pages: there users chose 4, then 0, with 2;
    # the feed's list says 2 is nearest 5.
    feed = Neighbours(
        positions=np.array([[-1], [-1], [5], [-1], [-1], [-1]], np.int32),
        similarity=np.array([[0], [0], [0.02], [0], [0], [0]], np.float32),
    )
    base = artifacts()
    catalog = dataclasses.replace(
        base.catalog, vectors=VECTORS, neighbours=feed, page_neighbours=NEIGHBOURS
    )
    rules = RerankRules(boost=())
    served = serving_artifacts(base.schema, catalog, rules, base.routing, KEYS)
    ctx = RequestContext("r1", time.monotonic() + 0.1, 0.01, served, ServiceMetrics())
    failing = FakeSearch(error=RecallError(FailureKind.ERROR, "index gone"))
    found = await ViewedSource(failing, count=5).candidates(
        Recalling(_viewing(2), 6), Taken.holding(np.empty(0, np.int64)), ctx
    )
    assert found.tolist() == [4, 0]
    # The latest signals read the feed's list: what is near the item viewed is 5.
    query = Query("u1", 3, moment=Moment(page="home"), viewed_item_id="i2")
    user = (await UserFeatureHydrator(FakeUserStore(), 0.02).run(query, ctx)).user
    assert user.nearby.items.tolist() == [5]
    # The model's order 5, 3, 4, 0: 4, the page list's closest to 2, gains 5 and leads.
    scored = Scored(np.array([5, 3, 4, 0], np.int64), np.array([2.0, 1.5, 1.0, 0.5], np.float32))
    page = await Reranker(clock=time.time).run(Ranked(_viewing(2), scored, ModelUsed()), ctx)
    assert [item.item_id for item in page.items] == ["i4", "i0", "i5"]


async def test_an_added_item_has_no_neighbours_and_a_reload_serves_the_lists_it_read() -> None:
    feed = Neighbours(NEIGHBOURS.positions[:, ::-1].copy(), NEIGHBOURS.similarity[:, ::-1].copy())
    catalog = dataclasses.replace(
        artifacts().catalog,
        index=faiss.IndexFlatIP(2),
        vectors=VECTORS,
        neighbours=feed,
        page_neighbours=NEIGHBOURS,
    )
    grown = with_room(catalog, capacity=2, blob_width=3)
    room = grown.room
    assert room is not None
    room.apply(ChangeBatch(1, (ItemChange("n6", 6, "t", ("a",), 1, 9, (0.5,), (1.0, 2.0)),), ()))
    grown = in_room(grown, room)
    assert grown.size == 7
    assert grown.neighbours_for_pages is NEIGHBOURS  # the world's, never copied
    # The page of the added item: nothing chosen with it, the vectors' nearest only.
    served = serving_artifacts(
        artifacts().schema, grown, RerankRules(boost=()), artifacts().routing, KEYS
    )
    ctx = RequestContext("r1", time.monotonic() + 0.1, 0.01, served, ServiceMetrics())
    found = await ViewedSource(FakeSearch(hits=[3]), count=3).candidates(
        Recalling(_viewing(6), 7), Taken.holding(np.empty(0, np.int64)), ctx
    )
    assert found.tolist() == [3]
    # Among the latest positives it is near nothing; the world's item beside it still is.
    assert feed.around(np.array([6, 2]), 0.9).items.tolist() == [4, 0]
    # A reload of the same world reads its files again: those lists are served, the room's
    # items kept.
    again = Neighbours(NEIGHBOURS.positions[:, :1].copy(), NEIGHBOURS.similarity[:, :1].copy())
    reloaded = in_room(dataclasses.replace(catalog, page_neighbours=again), room)
    assert reloaded.neighbours_for_pages is again
    assert reloaded.size == 7
