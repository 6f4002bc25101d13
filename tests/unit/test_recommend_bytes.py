"""The gate's direct answer sends the bytes the FastAPI route's response model sent."""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any, cast

import pydantic_core
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
from app.core.vocabulary import Variant, WorldRole
from app.pipeline.context import RequestContext
from app.pipeline.types import ModelUsed, RankedItem, Recommendation
from app.release.artifacts import ServingArtifacts
from app.world.stamp import WorldStamp

scores = st.one_of(
    st.none(), st.floats(), st.floats(min_value=-1e-3, max_value=1e-3), st.sampled_from([1.2e-05])
)
ids = st.text(min_size=1, max_size=8).filter(lambda s: "\x00" not in s)


def _as_the_route_sent(
    result: Recommendation, body: RecommendRequest, ctx: Any, stamp: Any, role: WorldRole
) -> bytes:
    """What the route built (a model per item) and FastAPI rendered (pydantic's JSON writer,
    the fields left unset out)."""
    built = RecommendResponse(
        request_id=ctx.request_id,
        answer_id="a1",
        user_id=body.user_id,
        items=[
            RecommendedItem(item_id=item.item_id, score=item.score, rank=rank)
            for rank, item in enumerate(result.items, start=1)
        ],
        model=ModelInfo(
            name="ranker", version=result.model.version or None, variant=result.model.variant
        ),
        artifacts="index:catalog:rules",
        world=WorldInfo(id=stamp.world_id if stamp is not None else "", role=role),
        cold_start=result.cold_start,
        degraded=ctx.degraded,
        **({"timings_ms": ctx.timings_ms} if body.debug else {}),
    )
    return built.model_dump_json(exclude_unset=True).encode()


@given(
    ranked=st.lists(st.tuples(ids, scores), max_size=30),
    debug=st.booleans(),
    version=st.sampled_from(["", "3"]),
    variant=st.sampled_from(list(Variant)),
    stamped=st.booleans(),
    role=st.sampled_from(list(WorldRole)),
    degraded=st.lists(st.sampled_from(["rank:timeout", "features:error"]), max_size=2),
    cold=st.booleans(),
)
def test_an_answer_is_sent_as_the_response_model_sent_it(
    ranked: list[tuple[str, float | None]],
    debug: bool,
    version: str,
    variant: Variant,
    stamped: bool,
    role: WorldRole,
    degraded: list[str],
    cold: bool,
) -> None:
    result = Recommendation(
        [RankedItem(item_id, score) for item_id, score in ranked], cold, ModelUsed(variant, version)
    )
    body = RecommendRequest(user_id="u1", debug=debug)
    ctx = SimpleNamespace(request_id="r1", degraded=degraded, timings_ms={"recall": 0.25})
    artifacts = SimpleNamespace(model=SimpleNamespace(name="ranker"), label="index:catalog:rules")
    stamp = SimpleNamespace(world_id="w-1") if stamped else None
    made = recommend.content(
        cast(RequestContext, ctx),
        "a1",
        body,
        result,
        cast(ServingArtifacts, artifacts),
        (cast(WorldStamp | None, stamp), role),
    )
    sent = pydantic_core.to_json(made)
    if all(score is None or math.isfinite(score) for _, score in ranked):
        assert sent == _as_the_route_sent(result, body, ctx, stamp, role)
    # A number JSON cannot hold is sent as null, as the response model's JSON sends it.
    for (_, score), item in zip(ranked, made["items"], strict=True):
        if score is not None and not math.isfinite(score):
            assert item["score"] is None
    assert RecommendResponse.model_validate_json(sent).items == [
        RecommendedItem.model_validate(item) for item in made["items"]
    ]


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


@pytest.mark.parametrize(
    ("raw", "budget"),
    [(None, None), ("25", 25), (" 007 ", 7), ("1" + "0" * 400, 10**9), ("9" * 5000, 10**9)],
)
def test_a_budget_header_of_any_length_is_read_without_overflow(
    raw: str | None, budget: int | None
) -> None:
    assert recommend.requested_budget_ms(raw) == budget


@pytest.mark.parametrize("raw", ["0", "000", "-5", "1.5", "", "²", "1e3"])
def test_a_budget_that_is_no_positive_integer_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        recommend.requested_budget_ms(raw)
