"""The release plan, the user's share, the rank stage's routing and the shadow's agreement."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import numpy.typing as npt
import pytest

from app.core.errors import ConfigError, FailureKind, RankingModelError
from app.core.vocabulary import Scores, Variant
from app.pipeline.context import RequestContext
from app.pipeline.shadow import top_agreement
from app.pipeline.stages.rank import Scorer
from app.pipeline.types import Hydrated, HydratedCandidates, Packed
from app.process.reload import _warm_new
from app.release.plan import (
    ModelRouting,
    ReleasePlan,
    Routed,
    in_share,
    read_plan,
    user_bucket,
    write_plan,
)
from tests.unit.fakes import FakeFallback, FakeModel, asked, context

USERS = [f"user-{n}" for n in range(20_000)]


def test_a_users_bucket_is_fixed_and_shares_are_nested_and_close_to_their_percent() -> None:
    assert user_bucket("u42") == user_bucket("u42")
    assert user_bucket("u42") == 1823  # fixed across processes and releases: hashed, not salted
    for percent in (1.0, 10.0, 50.0):
        share = sum(in_share(user, percent) for user in USERS) / len(USERS)
        assert share == pytest.approx(percent / 100, abs=0.01)
    # Raising the share only adds users: everyone in 10% is in 50%.
    assert all(in_share(u, 50.0) for u in USERS if in_share(u, 10.0))
    assert not any(in_share(u, 0.0) for u in USERS)
    assert all(in_share(u, 100.0) for u in USERS)


def test_the_release_file_round_trips_and_without_one_the_setting_is_stable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "release.toml"
    plan = ReleasePlan(stable="3", canary="4", canary_percent=12.5, shadow="5")
    write_plan(path, plan)
    assert read_plan(path, "") == plan
    assert read_plan(None, "2") == ReleasePlan(stable="2")
    assert plan.without_trials() == ReleasePlan(stable="3")
    assert list(tmp_path.iterdir()) == [path]  # nothing staged is left beside it


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[model\n", "not readable TOML"),
        ('[model]\nstable = "latest"\n', "model.stable must be a version number"),
        ("[model]\ncanary_percent = 120\n", "from 0 to 100"),
        ("[model]\ncanary_percent = true\n", "from 0 to 100"),
        ('[model]\nstable = "2"\ncanary = "2"\n', "the canary is the stable version"),
        ('[model]\nstabel = "2"\n', "unknown keys ['stabel']"),
        ('[models]\nstable = "2"\n', "unknown keys ['models']"),
    ],
)
def test_a_bad_release_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "release.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_plan(path, "")


def test_a_version_may_be_written_as_a_number(tmp_path: Path) -> None:
    path = tmp_path / "release.toml"
    path.write_text("[model]\nstable = 1\ncanary = 2\ncanary_percent = 5\n")
    assert read_plan(path, "") == ReleasePlan(stable="1", canary="2", canary_percent=5.0)


@pytest.mark.parametrize(
    ("served", "shadow", "expected"),
    [
        ([5, 4, 3, 2, 1], [5, 4, 3, 2, 1], 1.0),
        ([5, 4, 3, 2, 1], [1, 2, 3, 4, 5], 0.0),  # top 2 of 5 compared below
        ([5, 4, 3, 2, 1], [4, 5, 1, 2, 3], 1.0),  # the same two on top, in another order
        ([5, 4, 3, 2, 1], [5, 1, 4, 2, 3], 0.5),
    ],
)
def test_agreement_is_the_share_of_the_served_top_in_the_shadows_top(
    served: list[float], shadow: list[float], expected: float
) -> None:
    as_scores = np.array(served, np.float32), np.array(shadow, np.float32)
    assert top_agreement(*as_scores, top_n=2) == expected
    assert top_agreement(np.empty(0, np.float32), np.empty(0, np.float32)) == 1.0


class RecordingShadow:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def compare(
        self, rows: npt.NDArray[np.float32], served: Scores, shadow: Routed, request_id: str
    ) -> None:
        self.calls.append((shadow.version, request_id))


def _routed_context(user_id: str) -> RequestContext:
    ctx = context()
    stable = ctx.artifacts.routing.stable
    routing = ModelRouting(
        Routed("1", stable.signature),
        canary=Routed("2", stable.signature),
        canary_percent=50.0,
        shadow=Routed("3", stable.signature),
    )
    ctx.artifacts = dataclasses.replace(ctx.artifacts, routing=routing)
    ctx.user_id = user_id
    return ctx


def _packed(rows: int) -> Packed:
    blobs = np.ones((rows, 3), np.float32)
    positions = np.arange(rows, dtype=np.int64)
    items = HydratedCandidates(positions, np.arange(rows), blobs)
    return Packed(Hydrated(asked(), items), np.ones((rows, 15), np.float32))


async def test_the_rank_stage_routes_by_user_and_records_who_answered() -> None:
    in_canary = next(u for u in USERS if in_share(u, 50.0))
    not_in = next(u for u in USERS if not in_share(u, 50.0))
    model, shadow = FakeModel(), RecordingShadow()
    scorer = Scorer(model, None, 0.05, shadow)
    for user, expected in ((in_canary, (Variant.CANARY, "2")), (not_in, (Variant.STABLE, "1"))):
        ctx = _routed_context(user)
        ranked = await scorer.run(_packed(3), ctx)
        assert (ranked.model.variant, ranked.model.version) == expected
        assert ctx.metrics.answer_count[expected[0]]._value.get() == 1
    assert model.versions == ["2", "1"]
    assert shadow.calls == [("3", "r1"), ("3", "r1")]


async def test_when_triton_fails_the_fallback_answers_and_nothing_is_shadowed() -> None:
    model = FakeModel(error=RankingModelError(FailureKind.UNAVAILABLE, "down"))
    shadow = RecordingShadow()
    scorer = Scorer(model, FakeFallback(), 0.05, shadow)
    ctx = _routed_context("someone")
    ranked = await scorer.run(_packed(3), ctx)
    assert not np.isnan(ranked.scored.scores).any()  # the in-process model scored them
    assert (ranked.model.variant, ranked.model.version) == (Variant.FALLBACK, "")
    assert shadow.calls == []


async def test_a_failing_canary_is_replaced_by_the_stable_version_and_flagged() -> None:
    in_canary = next(u for u in USERS if in_share(u, 50.0))
    model = FakeModel(
        failing_versions={"2": RankingModelError(FailureKind.UNAVAILABLE, "version 2 unloaded")}
    )
    scorer = Scorer(model, None, 0.05, RecordingShadow())
    ctx = _routed_context(in_canary)
    ranked = await scorer.run(_packed(3), ctx)
    assert not np.isnan(ranked.scored.scores).any()
    assert model.versions == ["2", "1"]
    assert (ranked.model.variant, ranked.model.version) == (Variant.STABLE, "1")
    assert ctx.degraded == ["rank:unavailable"]


async def test_only_the_stable_versions_calls_go_through_the_breaker() -> None:
    in_canary = next(u for u in USERS if in_share(u, 50.0))
    not_in = next(u for u in USERS if not in_share(u, 50.0))
    model = FakeModel()
    scorer = Scorer(model, None, 0.05)
    for user in (in_canary, not_in):
        await scorer.run(_packed(3), _routed_context(user))
    assert list(zip(model.versions, model.guarded, strict=True)) == [("2", False), ("1", True)]


def _failing(*versions: str) -> FakeModel:
    """An endpoint answering as the version asked for, except `versions`."""
    error = RankingModelError(FailureKind.ERROR, "cannot run")
    return FakeModel(failing_versions=dict.fromkeys(versions, error))


def _routing(canary: bool) -> ModelRouting:
    signature = context().artifacts.model
    return ModelRouting(
        Routed("1", signature),
        canary=Routed("2", signature) if canary else None,
        canary_percent=10.0 if canary else 0.0,
    )


@pytest.mark.parametrize("endpoints", [1, 2])
async def test_new_versions_are_warmed_on_every_triton_and_served_ones_are_not(
    endpoints: int,
) -> None:
    pool = SimpleNamespace(endpoints=[_failing() for _ in range(endpoints)])
    schema = context().artifacts.schema
    await _warm_new(pool, _routing(canary=True), schema, serving=None)  # type: ignore[arg-type]
    full_chunk = context().artifacts.model.max_batch_size
    for endpoint in pool.endpoints:
        assert endpoint.versions == ["1", "2"]
        assert endpoint.rows == [full_chunk, full_chunk]
        assert endpoint.guarded == [False, False]  # a warm-up never trips the breaker
        endpoint.versions.clear()
    await _warm_new(pool, _routing(canary=True), schema, serving=_routing(canary=False))  # type: ignore[arg-type]
    assert [e.versions for e in pool.endpoints] == [["2"]] * endpoints


async def test_a_failed_warm_up_refuses_a_new_version_but_not_the_stable_one_at_start() -> None:
    schema = context().artifacts.schema
    stable_fails = SimpleNamespace(endpoints=[_failing("1")])
    await _warm_new(stable_fails, _routing(canary=False), schema, serving=None)  # type: ignore[arg-type]
    canary_fails = SimpleNamespace(endpoints=[_failing("2")])
    with pytest.raises(RankingModelError, match="cannot run"):
        await _warm_new(canary_fails, _routing(canary=True), schema, serving=None)  # type: ignore[arg-type]
    # A reload that makes a version that cannot run the stable one is refused.
    promoted = ModelRouting(Routed("3", context().artifacts.model))
    fails_as_stable = SimpleNamespace(endpoints=[_failing("3")])
    with pytest.raises(RankingModelError, match="cannot run"):
        await _warm_new(fails_as_stable, promoted, schema, serving=_routing(canary=False))  # type: ignore[arg-type]
