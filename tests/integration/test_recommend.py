"""POST /recommend against real Redis and Triton."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import redis
from httpx import AsyncClient

from app.clients.feature_store import encode_seen
from app.pipeline.packing import encode_context, pack_rows
from app.release.keyspace import KeySpace
from app.world.attributes import load_attributes
from app.world.layout import MODEL_FILE
from app.world.schema import HEAD_NAMES, HEADS_OUTPUT
from app.world.tables import load_items, load_seen, load_users
from tests.integration.conftest import CONTEXT, PLAIN_RULES, Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
# Every stage runs on every request, so each is timed and counted: the cascade in full.
EVERY_STAGE = {
    "features",
    "recall",
    "filter",
    "prerank",
    "fetch",
    "pack",
    "rank",
    "rerank",
}


async def _recommend(client: AsyncClient, **body: object) -> dict[str, Any]:
    response = await client.post("/recommend", json={"context": CONTEXT, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _item_ids(answer: dict[str, Any]) -> list[str]:
    return [item["item_id"] for item in answer["items"]]


def _model_scores(stack: Stack, user_id: str) -> dict[str, float]:
    """Every item's score for this user, computed outside the service with onnxruntime."""
    return _model_outputs(stack, user_id)[0]


def _model_outputs(stack: Stack, user_id: str) -> tuple[dict[str, float], dict[str, float]]:
    """Every item's score and like probability for this user, computed with onnxruntime."""
    schema, items, users = stack.schema, load_items(stack.world), load_users(stack.world)
    user_at = users.ids.tolist().index(user_id)
    user_blob = np.concatenate([users.embeddings[user_at], users.dense[user_at]])
    item_blobs = np.concatenate([items.embeddings, items.dense], axis=1)
    context = encode_context(
        schema,
        CONTEXT["device"],
        CONTEXT["page"],
        CONTEXT["locale"],
        10,
        2,
    )
    rows = pack_rows(schema, user_blob, item_blobs, context)
    session = ort.InferenceSession(str(stack.world / MODEL_FILE))
    scores, heads = session.run([schema.output_name, HEADS_OUTPUT], {schema.input_name: rows})
    ids = items.ids.tolist()
    likes = heads[:, HEAD_NAMES.index("like")].tolist()
    return dict(zip(ids, scores.ravel().tolist(), strict=True)), dict(zip(ids, likes, strict=True))


def _seen(stack: Stack, user_id: str) -> set[str]:
    seen = load_seen(stack.world)
    assert seen is not None
    at = seen.user_ids.tolist().index(user_id)
    return set(seen.item_ids[seen.offsets[at] : seen.offsets[at + 1]].tolist())


async def test_answer_is_the_models_top_n(stack: Stack, plain_client: AsyncClient) -> None:
    answer = await _recommend(plain_client, user_id="u7", num_items=15, debug=True)

    expected_scores = _model_scores(stack, "u7")
    unseen = {k: v for k, v in expected_scores.items() if k not in _seen(stack, "u7")}
    expected_top = sorted(unseen, key=lambda item: (-unseen[item], int(item[1:])))[:15]
    assert _item_ids(answer) == expected_top
    returned = [item["score"] for item in answer["items"]]
    np.testing.assert_allclose(returned, [unseen[i] for i in expected_top], rtol=1e-5)
    assert [item["rank"] for item in answer["items"]] == list(range(1, 16))
    assert answer["degraded"] == []
    assert answer["cold_start"] is False
    assert answer["model"] == {"name": "ranking_model", "version": "1", "variant": "stable"}
    assert set(answer["timings_ms"]) == EVERY_STAGE


async def test_the_like_weight_ranks_by_the_score_valued_by_the_like_head(
    stack: Stack, plain_client: AsyncClient
) -> None:
    from tests.integration.conftest import serving

    plain = _item_ids(await _recommend(plain_client, user_id="u7", num_items=15))
    rules = stack.root / "likes-rules.toml"
    rules.write_text(PLAIN_RULES + "[objectives]\nlike = 1.0\n")
    settings = stack.settings(rules_file=rules, candidate_count=5000, prerank_keep=5000)
    async with serving(settings) as liking:
        answer = await _recommend(liking, user_id="u7", num_items=15)
    scores, likes = _model_outputs(stack, "u7")
    seen = _seen(stack, "u7")
    # The score is a log-odds: a like weight of 1 multiplies its odds by P(like).
    valued = {item: scores[item] + np.log(likes[item]) for item in scores if item not in seen}
    expected = sorted(valued, key=lambda item: (-valued[item], int(item[1:])))[:15]
    assert _item_ids(answer) == expected
    returned = [item["score"] for item in answer["items"]]
    np.testing.assert_allclose(returned, [valued[item] for item in expected], rtol=1e-4)
    assert answer["degraded"] == []
    assert _item_ids(answer) != plain, "the like head changed nothing"


async def test_default_request_has_twenty_items_and_no_timings(client: AsyncClient) -> None:
    answer = await _recommend(client, user_id="u3")
    assert len(answer["items"]) == 20
    assert "timings_ms" not in answer
    assert answer["degraded"] == []
    assert len(set(_item_ids(answer))) == 20
    assert all("attributes" not in item for item in answer["items"])


async def test_attributes_come_only_when_asked_for(stack: Stack, client: AsyncClient) -> None:
    held = load_attributes(stack.world, len(load_items(stack.world).ids))
    answer = await _recommend(client, user_id="u3", attributes=["title"])
    positions = _positions(stack, _item_ids(answer))
    titles = [item["attributes"] for item in answer["items"]]
    assert titles == [{"title": str(held.columns["title"][p])} for p in positions]
    assert all(title["title"] for title in titles)
    both = await _recommend(client, user_id="u3", attributes=["categories", "title"])
    assert set(both["items"][0]["attributes"]) == {"categories", "title"}
    unknown = await client.post(
        "/recommend", json={"user_id": "u3", "attributes": ["title", "price"]}
    )
    assert unknown.status_code == 422
    assert unknown.json()["fields"][0]["field"] == "attributes.1"


def _positions(stack: Stack, item_ids: list[str]) -> list[int]:
    catalog = load_items(stack.world).ids.tolist()
    return [catalog.index(item) for item in item_ids]


async def test_seen_items_are_dropped(stack: Stack, plain_client: AsyncClient) -> None:
    first = await _recommend(plain_client, user_id="u11", num_items=10)
    newly_seen = _item_ids(first)[:3]
    store = redis.Redis.from_url(stack.redis_url)
    key = KeySpace("recsys").seen("u11")
    stored = store.get(key)
    try:
        store.append(key, encode_seen(_positions(stack, newly_seen)))  # as events add them
        second = await _recommend(plain_client, user_id="u11", num_items=10)
    finally:
        store.set(key, stored or b"")
        store.close()
    assert not set(newly_seen) & set(_item_ids(second))
    assert len(second["items"]) == 10
    assert _item_ids(second)[:7] == _item_ids(first)[3:10]


async def test_a_history_of_any_length_is_filtered_whole(
    stack: Stack, plain_client: AsyncClient
) -> None:
    catalog = load_items(stack.world).ids.tolist()
    unseen = set(catalog[-30:])
    history = list(range(len(catalog) - 30))  # every other item, oldest first
    store = redis.Redis.from_url(stack.redis_url)
    key = KeySpace("recsys").seen("u13")
    stored = store.get(key)
    try:
        store.set(key, encode_seen(history))
        answer = await _recommend(plain_client, user_id="u13", num_items=10)
    finally:
        store.set(key, stored or b"")
        store.close()
    assert len(history) > 2000
    assert answer["degraded"] == []
    assert len(answer["items"]) == 10
    assert set(_item_ids(answer)) <= unseen


async def test_excluded_items_are_dropped_and_backfilled(client: AsyncClient) -> None:
    first = await _recommend(client, user_id="u5", num_items=10)
    excluded = _item_ids(first)[:4]
    second = await _recommend(client, user_id="u5", num_items=10, exclude_item_ids=excluded)
    assert not set(excluded) & set(_item_ids(second))
    assert len(second["items"]) == 10


async def test_blocked_items_and_diversity_rules(stack: Stack) -> None:
    from tests.integration.conftest import serving

    items = load_items(stack.world)
    category_of = dict(zip(items.ids.tolist(), items.categories.tolist(), strict=True))
    async with serving(stack.settings(rules_file=stack.plain_rules)) as plain:
        unruled = _item_ids(await _recommend(plain, user_id="u9", num_items=10))
    rules = stack.root / "strict-rules.toml"
    rules.write_text(f'[diversity]\nmax_per_category = 1\n[block]\nitem_ids = ["{unruled[0]}"]\n')
    async with serving(stack.settings(rules_file=rules)) as strict:
        ruled = _item_ids(await _recommend(strict, user_id="u9", num_items=10))
    assert unruled[0] not in ruled
    categories = [category_of[item] for item in ruled]
    assert len(set(categories)) == len(categories) == 10
    assert len(set(category_of[item] for item in unruled)) < 10, "rules had nothing to do"


async def test_cold_user_gets_a_full_answer(client: AsyncClient) -> None:
    answer = await _recommend(client, user_id="someone-new", num_items=12)
    assert answer["cold_start"] is True
    assert answer["degraded"] == []
    assert len(answer["items"]) == 12


async def test_more_items_than_candidates(stack: Stack) -> None:
    from tests.integration.conftest import serving

    async with serving(stack.settings(candidate_count=10, popular_candidates=0)) as few:
        answer = await _recommend(few, user_id="u2", num_items=200)
    ids = _item_ids(answer)
    assert len(ids) == len(set(ids)) == 200
    assert answer["degraded"] == []


async def test_every_stage_is_measured(client: AsyncClient) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    await _recommend(client, user_id="u1")
    text = (await client.get("/metrics")).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    counts = {
        sample.labels["stage"]: sample.value
        for sample in families["recsys_stage_duration_seconds"].samples
        if sample.name.endswith("_count")
    }
    assert set(counts) == EVERY_STAGE
    assert all(count >= 1 for count in counts.values())
    requests = {
        s.labels["outcome"]: s.value
        for s in families["recsys_requests"].samples
        if s.name == "recsys_requests_total"
    }
    assert requests["ok"] >= 1


async def test_a_flood_of_readiness_checks_asks_redis_about_once(
    stack: Stack, client: AsyncClient
) -> None:
    store = redis.Redis.from_url(stack.redis_url)

    def hget_calls() -> int:
        stats = store.info("commandstats").get("cmdstat_hget", {})
        return int(stats.get("calls", 0))

    try:
        before = hget_calls()
        answers = await asyncio.gather(*(client.get("/readyz") for _ in range(50)))
        after = hget_calls()
    finally:
        store.close()
    assert {answer.status_code for answer in answers} == {200}
    assert after - before <= 2  # one check a second at most, whoever asks
