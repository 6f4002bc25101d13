"""A world whose index has cells (IVF), as every production-size catalog's has: items added
while serving are filed under the index's cells, found through them, refiled at a reload
that runs while requests do, and found again after it.

The stack's world has 3,000 items, which the build gives an exact (flat) index; this copy
of it gets an IVF index over the same vectors, under the same world id, so the stack's
Redis and Triton serve it unchanged.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import faiss
import httpx
import pytest
from recsys_tools.world.store.index import build_index, save_index

from app.world.layout import INDEX_FILE
from app.world.manifest import read_manifest, update_manifest
from app.world.stamp import file_digest
from tests.integration.conftest import CONTEXT, Stack, metric_samples, serving
from tests.integration.test_catalog_changes import USER, _answer, _categories, _like_the_top

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
TOKEN = "ivf-world-test-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CELLS = 16
# Probing 2 of the 16 cells: the added items the user's vector does not probe are not
# scored, so finding them at all depends on their being filed under the right cells.
NPROBE = 2


def _reindexed(world: Path, cells: int) -> None:
    """The world's index rebuilt with `cells` cells over the same vectors, its digest noted."""
    index = faiss.read_index(str(world / INDEX_FILE))
    vectors = index.reconstruct_n(0, index.ntotal)
    save_index(world, build_index(vectors, f"IVF{cells},Flat"))
    files = dict(read_manifest(world).files)
    files[INDEX_FILE] = file_digest(world / INDEX_FILE)
    update_manifest(world, files=files)


@pytest.fixture
def ivf_world(stack: Stack, tmp_path: Path) -> Path:
    world = tmp_path / "world"
    shutil.copytree(stack.world, world)
    flat = faiss.read_index(str(world / INDEX_FILE))
    assert not isinstance(flat, faiss.IndexIVF)  # what the build gives 3,000 items
    _reindexed(world, CELLS)
    return world


async def _arrivals(api: httpx.AsyncClient) -> list[str]:
    """What the arrivals source brought for USER, by a traced request, sorted."""
    body = {"user_id": USER, "num_items": 20, "context": CONTEXT, "debug": True}
    answer = (await api.post("/recommend", json=body)).json()
    trace = (await api.get(f"/debug/traces/{answer['answer_id']}")).json()
    sources = trace["records"]["recall"]["tables"]["sources"]["rows"]
    (arrivals,) = [row for row in sources if row["source"] == "arrivals"]
    return sorted(arrivals["first"])


async def _user_answers(
    api: httpx.AsyncClient, started: asyncio.Event, stop: asyncio.Event
) -> list[dict[str, Any]]:
    """Rounds of two dozen users' requests at once, from `started` on until `stop`, and one
    more after it: whatever the reload does, requests are in flight beside it."""
    bodies = [{"user_id": f"u{n}", "num_items": 20, "context": CONTEXT} for n in range(24)]
    answers = []
    last = False
    while not last:
        last = stop.is_set()
        rounds = [asyncio.create_task(api.post("/recommend", json=b)) for b in bodies]
        started.set()
        for response in await asyncio.gather(*rounds):
            assert response.status_code == 200, response.text
            answers.append(response.json())
    return answers


async def test_added_items_are_found_through_the_cells_before_and_after_a_reload(
    stack: Stack, loaded_redis: str, ivf_world: Path
) -> None:
    index = faiss.read_index(str(ivf_world / INDEX_FILE))
    assert faiss.extract_index_ivf(index).nlist == CELLS
    settings = stack.settings(
        artifacts_dir=ivf_world,
        redis_url=loaded_redis,
        index_nprobe=NPROBE,
        recall_threads=2,  # searches in threads, beside the reload's own
        recall_queue=64,  # room for the two dozen at once
        admin_token=TOKEN,
        debug_pages=True,
        request_budget_ms=2_000,
    )
    async with serving(settings) as api:
        top = (await _answer(api))[0]
        near = {
            "categories": await _categories(api, top),
            **_like_the_top(loaded_redis, top, stack.schema.embedding_dim),
        }
        # Three items along the user's own direction, one against it.
        far = {**near, "embedding": [-v for v in near["embedding"]]}
        added = [{"item_id": f"cell-{n}", "title": f"Filed {n}", **near} for n in range(3)]
        added.append({"item_id": "opposite", "title": "Opposite", **far})
        put = await api.post("/catalog/items", json={"items": added}, headers=AUTH)
        assert put.status_code == 200, put.text
        assert {"cell-0", "cell-1", "cell-2"} <= set(await _answer(api, n=200))
        # Through the cells, arrivals scores only the added items under the cells the user
        # probes: the three near ones, not the opposite one (an exact scan would take all
        # four, being asked for more).
        assert await _arrivals(api) == ["cell-0", "cell-1", "cell-2"]
        # A new index (other cells) under the same world: the reload reads it and refiles
        # the added items under its cells, while requests for two dozen users keep coming.
        await asyncio.to_thread(_reindexed, ivf_world, 2 * CELLS)
        started, stop = asyncio.Event(), asyncio.Event()
        load = asyncio.create_task(_user_answers(api, started, stop))
        await started.wait()
        reloaded = await api.post("/admin/reload", headers=AUTH)
        stop.set()
        during = await load
        assert reloaded.status_code == 200, reloaded.text
        assert {"cell-0", "cell-1", "cell-2"} <= set(await _answer(api, n=200))
        assert await _arrivals(api) == ["cell-0", "cell-1", "cell-2"]
        samples = metric_samples((await api.get("/metrics")).text)
    assert samples["recsys_reloads_total{outcome=applied}"] == 1
    lost = [a["degraded"] for a in during if any(d.startswith("recall") for d in a["degraded"])]
    assert not lost, lost
