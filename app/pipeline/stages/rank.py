"""Stage `rank`: model scores from Triton; in process, or recall order, when it cannot answer."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from app.core.errors import FailureKind, RankingModelError
from app.core.vocabulary import Heads, Scores, Stage, Variant
from app.pipeline.context import RequestContext
from app.pipeline.stages.rank_trace import record_rank
from app.pipeline.types import HydratedCandidates, ModelUsed, Packed, Ranked, Scored
from app.release.plan import ModelAnswer, Routed

# Left after a fallback for the rerank and the answer itself.
ANSWER_S = 0.002
FALLBACK = ModelUsed()
_NO_SCORES: Scores = np.empty(0, dtype=np.float32)
_NO_ANSWER = ModelAnswer(_NO_SCORES, "")


class RemoteModel(Protocol):
    async def score(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
        guarded: bool = True,
    ) -> ModelAnswer:
        """`guarded`: through the endpoint's breaker (a trial version's calls are not)."""
        ...


class FallbackModel(Protocol):
    async def score(self, rows: npt.NDArray[np.float32], timeout_s: float) -> Scores:
        """Scores of the first rows that fit in timeout_s (fewer than rows, possibly)."""
        ...


class ShadowScorer(Protocol):
    def compare(
        self, rows: npt.NDArray[np.float32], served: Scores, shadow: Routed, request_id: str
    ) -> None:
        """Score the rows with `shadow` later, off the request's path, and record agreement."""
        ...


def scores_by_candidate(
    hydrated: HydratedCandidates, values: Scores, heads: Heads | None = None
) -> tuple[Scored, int]:
    """Spread the scores (and the heads, where the model gave them) of the first
    `len(values)` rows over the candidates.

    Rows are the hydrated candidates' blobs in order; a candidate without a score gets NaN.
    One whose score is NaN or Inf is dropped; the count of those is returned too.
    """
    scores = np.full(len(hydrated.positions), np.nan, dtype=np.float32)
    scored_at = hydrated.found[: len(values)]
    finite = np.isfinite(values)
    scores[scored_at[finite]] = values[finite]
    spread = None
    if heads is not None:
        spread = np.full((len(hydrated.positions), heads.shape[1]), np.nan, dtype=np.float32)
        spread[scored_at[finite]] = heads[finite]
    if finite.all():
        return Scored(hydrated.positions, scores, spread), 0
    keep = np.ones(len(scores), dtype=bool)
    keep[scored_at[~finite]] = False
    kept_heads = None if spread is None else spread[keep]
    return Scored(hydrated.positions[keep], scores[keep], kept_heads), int((~finite).sum())


class Scorer:
    """Scores candidates' rows, keeping their order; falls back instead of failing.

    The routing in the request's artifacts picks the version by user: the stable one, or
    the canary for the users in its share. The answer says which variant and version scored
    it (FALLBACK when Triton did not), for the response and the metrics.
    """

    stage = Stage.RANK

    def __init__(
        self,
        model: RemoteModel,
        fallback: FallbackModel | None,
        timeout_s: float,
        shadow: ShadowScorer | None = None,
    ) -> None:
        self._model = model
        self._fallback = fallback
        self._timeout_s = timeout_s
        self._shadow = shadow

    async def _remote(
        self, rows: npt.NDArray[np.float32], ctx: RequestContext
    ) -> tuple[Variant, ModelAnswer] | None:
        """The routed version's answer; a failing canary is replaced by the stable version,
        and its failures are kept from the breaker that guards the stable one."""
        routing = ctx.artifacts.routing
        variant, routed = routing.pick(ctx.user_id)
        if variant is Variant.CANARY:
            try:
                timeout_s = ctx.time_for(self._timeout_s)
                answer = await self._model.score(
                    rows, routed, timeout_s, ctx.request_id, guarded=False
                )
                return variant, answer
            except RankingModelError as exc:
                ctx.degrade(Stage.RANK, exc.kind, f"canary version {routed.version}: {exc}")
            variant, routed = Variant.STABLE, routing.stable
        try:
            timeout_s = ctx.time_for(self._timeout_s)
            return variant, await self._model.score(rows, routed, timeout_s, ctx.request_id)
        except RankingModelError as exc:
            ctx.degrade(Stage.RANK, exc.kind, exc)
        return None

    async def _values(
        self, rows: npt.NDArray[np.float32], ctx: RequestContext
    ) -> tuple[ModelAnswer, ModelUsed]:
        remote = await self._remote(rows, ctx)
        if remote is not None:
            variant, answer = remote
            shadow = ctx.artifacts.routing.shadow
            if shadow is not None and self._shadow is not None:
                self._shadow.compare(rows, answer.scores, shadow, ctx.request_id)
            return answer, ModelUsed(variant, answer.version)
        if self._fallback is None:
            return _NO_ANSWER, FALLBACK
        # In process the combined score alone: rerank then weighs no heads.
        try:
            scores = await self._fallback.score(rows, ctx.remaining_s() - ANSWER_S)
            return ModelAnswer(scores, ""), FALLBACK
        except RankingModelError:
            return _NO_ANSWER, FALLBACK

    async def run(self, packed: Packed, ctx: RequestContext) -> Ranked:
        rows = packed.rows
        answer, model = await self._values(rows, ctx) if len(rows) else (_NO_ANSWER, FALLBACK)
        ctx.metrics.answer_count[model.variant].inc()
        scored, bad = scores_by_candidate(packed.hydrated.items, answer.scores, answer.heads)
        if bad:
            ctx.degrade(Stage.RANK, FailureKind.BAD_DATA, f"{bad} scores are NaN or Inf")
        ranked = Ranked(packed.hydrated.asked, scored, model)
        if ctx.trace is not None:
            artifacts = ctx.artifacts
            record_rank(ctx.trace, packed, ranked, artifacts.schema, artifacts.catalog)
        return ranked
