"""Item pages against a real Redis and Triton: the answer comes from around the item shown,
never holds it, takes an item added a moment ago near it, and each page keeps its own rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import redis

from app.release.keyspace import KeySpace
from app.world.layout import ITEMS_FILE
from app.world.neighbours import load_neighbours
from tests.integration.conftest import CONTEXT, Stack, metric_samples, serving

KEYS = KeySpace("recsys")
USER = "u7"


async def _answer(
    api: httpx.AsyncClient,
    n: int = 20,
    item_id: str | None = None,
    page: str = "home",
    attributes: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    context = {**CONTEXT, "page": page} | ({} if item_id is None else {"item_id": item_id})
    body = {"user_id": USER, "num_items": n, "context": context, "attributes": list(attributes)}
    answered = await api.post("/recommend", json=body)
    assert answered.status_code == 200, answered.text
    items: list[dict[str, Any]] = answered.json()["items"]
    return items


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [item["item_id"] for item in items]


def _best_known(world: Path) -> tuple[str, set[str]]:
    """The item users chose with the most others, and those others."""
    with np.load(world / ITEMS_FILE) as stored:
        ids = stored["ids"].astype(str)
    neighbours = load_neighbours(world, len(ids))
    assert neighbours is not None
    found = neighbours.positions >= 0
    best = int(np.argmax(found.sum(axis=1)))
    return str(ids[best]), {str(ids[p]) for p in neighbours.positions[best][found[best]]}


def _rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text("[diversity]\nmax_per_category = 0\n" + text)
    return path


async def test_an_item_page_answers_from_around_its_item_and_never_with_it(
    stack: Stack, tmp_path: Path
) -> None:
    rules = _rules(tmp_path, "[pages.product.objectives]\nviewed = 10.0\n")
    async with serving(stack.settings(rules_file=rules)) as api:
        shown, near = _best_known(stack.world)
        feed = _ids(await _answer(api))
        page = _ids(await _answer(api, item_id=shown, page="product"))
        assert shown not in page
        assert len(page) == 20
        # The feed is the user's; the page is the item's: most of it was chosen with it.
        assert len(near) >= 20
        assert sum(item in near for item in page) > sum(item in near for item in feed)
        assert sum(item in near for item in page[:10]) >= 5
        # An id the catalog lacks is no error: the feed is served.
        unknown = _ids(await _answer(api, item_id="no-such-item", page="product"))
        assert len(unknown) == 20
        samples = metric_samples((await api.get("/metrics")).text)
    assert samples["recsys_page_requests_total{page=product,viewed=known}"] == 1
    assert samples["recsys_page_requests_total{page=product,viewed=unknown}"] == 1
    assert samples["recsys_page_requests_total{page=home,viewed=none}"] == 1
    assert samples["recsys_filtered_candidates_total{reason=viewed}"] >= 1


async def test_an_item_added_a_moment_ago_is_on_its_neighbours_page(
    stack: Stack, loaded_redis: str
) -> None:
    async with serving(stack.settings(redis_url=loaded_redis)) as api:
        top = (await _answer(api, attributes=("categories",)))[0]
        shown = top["item_id"]
        client = redis.Redis.from_url(loaded_redis)
        try:
            blob = np.frombuffer(cast(bytes, client.get(KEYS.item(shown))), dtype="<f4")
        finally:
            client.close()
        dim = stack.schema.embedding_dim
        twin = {
            "item_id": "twin-1",
            "title": "A Close Likeness",
            "categories": str(top["attributes"]["categories"]).split("|"),
            "embedding": [float(v) for v in blob[:dim]],
            "dense": dict(zip(stack.schema.item_dense, map(float, blob[dim:]), strict=True)),
        }
        put = await api.post("/catalog/items", json={"items": [twin]})
        assert put.status_code == 200, put.text
        page = _ids(await _answer(api, item_id=shown, page="product"))
        assert "twin-1" in page
        # And the twin's own page, which the world's neighbours know nothing of, answers.
        own = _ids(await _answer(api, item_id="twin-1", page="product"))
        assert "twin-1" not in own
        assert len(own) == 20


async def test_each_page_is_reranked_by_its_own_section(stack: Stack, tmp_path: Path) -> None:
    rules = _rules(tmp_path, "[pages.product.diversity]\nmax_per_category = 1\n")
    async with serving(stack.settings(rules_file=rules)) as api:
        shown = _ids(await _answer(api))[0]
        product = await _answer(api, n=10, page="product", attributes=("categories",))
        home = await _answer(api, n=10, page="home", attributes=("categories",))
        page = await _answer(api, n=10, item_id=shown, page="product", attributes=("categories",))
    for answer in (product, page):
        categories = [item["attributes"]["categories"] for item in answer]
        assert len(set(categories)) == len(categories)
    assert len({item["attributes"]["categories"] for item in home}) < len(home)
