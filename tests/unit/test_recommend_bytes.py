"""The gate's direct answer sends the bytes the FastAPI route's response model sent."""

from __future__ import annotations

import json
import math
from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.api import recommend
from app.api.models import (
    ModelInfo,
    RecommendedItem,
    RecommendRequest,
    RecommendResponse,
    WorldInfo,
)
from app.api.recommend import items, json_bytes
from app.core.vocabulary import Variant, WorldRole
from app.pipeline.types import ModelUsed, RankedItem, Recommendation
from app.release.artifacts import ServingArtifacts

scores = st.one_of(st.none(), st.floats(), st.floats(min_value=-1e-300, max_value=1e-300))
ids = st.text(min_size=1, max_size=8).filter(lambda s: "\x00" not in s and s.isprintable())


def _as_the_route_sent(content: Any) -> bytes:
    """FastAPI: the response model's JSON mode without unset fields, then JSONResponse."""
    model = RecommendResponse.model_validate(content)
    return json_bytes(model.model_dump(mode="json", exclude_unset=True))


@given(
    ranked=st.lists(st.tuples(ids, scores), max_size=30),
    timings=st.none() | st.dictionaries(st.sampled_from(["recall", "rank"]), st.floats(0, 1e3)),
    version=st.sampled_from(["", "3"]),
)
def test_an_answer_is_sent_as_the_response_model_sent_it(
    ranked: list[tuple[str, float | None]], timings: dict[str, float] | None, version: str
) -> None:
    result = Recommendation(
        [RankedItem(item_id, score) for item_id, score in ranked],
        cold_start=False,
        model=ModelUsed(Variant.STABLE, version),
    )
    content: dict[str, Any] = {
        "request_id": "r1",
        "answer_id": "a1",
        "user_id": "u1",
        "items": items(result, cast(ServingArtifacts, None), []),
        "model": {"name": "ranker", "version": version or None, "variant": "stable"},
        "artifacts": "index:catalog:rules",
        "world": {"id": "", "role": WorldRole.STABLE.value},
        "cold_start": False,
        "degraded": ["rank:timeout"],
    }
    if timings is not None:
        content["timings_ms"] = timings
    assert json_bytes(content) == _as_the_route_sent(content)
    # As the route built it: a model per item, the response's models around them.
    built = RecommendResponse(
        request_id="r1",
        answer_id="a1",
        user_id="u1",
        items=[
            RecommendedItem(item_id=i.item_id, score=i.score, rank=n)
            for n, i in enumerate(result.items, 1)
        ],
        model=ModelInfo(name="ranker", version=version or None, variant=Variant.STABLE),
        artifacts="index:catalog:rules",
        world=WorldInfo(id="", role=WorldRole.STABLE),
        cold_start=False,
        degraded=["rank:timeout"],
        **({"timings_ms": timings} if timings is not None else {}),
    )
    sent = json.loads(json_bytes(content))
    if all(score is None or math.isfinite(score) for _, score in ranked):
        assert json_bytes(content) == json_bytes(built.model_dump(mode="json", exclude_unset=True))
    else:
        # The route's JSONResponse refused an infinite score (a 500); it is sent as null.
        infinite = [
            n for n, (_, score) in enumerate(ranked) if score is not None and math.isinf(score)
        ]
        assert all(sent["items"][n]["score"] is None for n in infinite)


async def test_the_gate_answers_a_valid_body_and_leaves_an_invalid_one_to_the_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[RecommendRequest] = []

    async def answered(worlds: object, body: RecommendRequest, scope: object) -> tuple[int, bytes]:
        asked.append(body)
        return 200, b'{"items":[]}'

    monkeypatch.setattr(recommend, "answer", answered)
    scope = {"app": SimpleNamespace(state=SimpleNamespace(worlds=object()))}
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    status = await recommend.serve(scope, b'{"user_id": "u1", "num_items": 3}', send)
    assert status == 200
    assert [body.num_items for body in asked] == [3]
    assert sent[0]["status"] == 200
    assert (b"content-length", b"12") in sent[0]["headers"]
    assert sent[1]["body"] == b'{"items":[]}'
    for invalid in (b"{", b"[]", b'{"user_id": 1}', b'{"user_id": "u", "x": 1}', b"[" * 100_000):
        sent.clear()
        assert await recommend.serve(scope, invalid, send) is None
        assert sent == []
        assert len(asked) == 1
