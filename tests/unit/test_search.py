"""Both ways of running the FAISS search, on a real three-vector index."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np
import pytest

from app.core.errors import FailureKind, RecallError
from app.pipeline.sources.ann import InlineSearch, PooledSearch
from app.release.catalog import Catalog


def _catalog(index: object) -> Catalog:
    return Catalog(
        item_ids=np.array(["a", "b", "c"]),
        categories=np.zeros(3, dtype=np.int64),
        published_at=np.zeros(3, dtype=np.int64),
        popular_order=np.arange(3, dtype=np.int64),
        default_user_blob=np.zeros(2, dtype=np.float32),
        index=index,
    )


def _index() -> object:
    index = faiss.IndexFlatIP(2)
    index.add(np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]], dtype=np.float32))
    return index


USER = np.array([1.0, 0.1], dtype=np.float32)


async def test_inline_and_pooled_searches_find_the_same_neighbours() -> None:
    catalog = _catalog(_index())
    with ThreadPoolExecutor(1) as pool:
        pooled = await PooledSearch(pool, 4).search(catalog, USER, 2, 1.0)
    inline = await InlineSearch().search(catalog, USER, 2, 1.0)
    assert inline.tolist() == pooled.tolist() == [0, 2]


@pytest.mark.parametrize("search", [InlineSearch(), PooledSearch(ThreadPoolExecutor(1), 4)])
async def test_no_time_left_is_a_timeout_before_searching(search: InlineSearch) -> None:
    with pytest.raises(RecallError) as caught:
        await search.search(_catalog(_index()), USER, 2, 0.0)
    assert caught.value.kind is FailureKind.TIMEOUT


async def test_a_faiss_failure_is_a_recall_error() -> None:
    untrained = faiss.IndexIVFFlat(faiss.IndexFlatIP(2), 2, 4, faiss.METRIC_INNER_PRODUCT)
    with pytest.raises(RecallError) as caught:
        await InlineSearch().search(_catalog(untrained), USER, 2, 1.0)
    assert caught.value.kind is FailureKind.ERROR


async def test_a_full_pool_falls_back_at_once() -> None:
    release = threading.Event()

    class Blocking:
        d = 2

        def search(self, vectors: object, k: int) -> tuple[object, object]:
            release.wait(5.0)
            return np.zeros((1, k)), np.zeros((1, k), dtype=np.int64)

    with ThreadPoolExecutor(1) as pool:
        search = PooledSearch(pool, 1)
        first = asyncio.ensure_future(search.search(_catalog(Blocking()), USER, 2, 5.0))
        await asyncio.sleep(0.05)
        with pytest.raises(RecallError) as caught:
            await search.search(_catalog(Blocking()), USER, 2, 5.0)
        release.set()
        assert (await first).tolist() == [0, 0]
    assert caught.value.kind is FailureKind.OVERLOADED
