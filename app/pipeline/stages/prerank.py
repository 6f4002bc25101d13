"""Stage `prerank`: a cheap score on every pooled candidate, in process, that keeps the best
few hundred for the model. The cascade's second step: recall casts a wide net (thousands),
the model scores only what pre-rank kept, so its cost follows `prerank_keep`, not the pool."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.errors import FailureKind
from app.core.vocabulary import Positions, Stage
from app.pipeline.context import RequestContext
from app.pipeline.signals import best, prerank_scores, prerank_signals
from app.pipeline.trace import Trace
from app.pipeline.types import Pool


class PreRanker:
    """The `keep` best candidates by the world's pre-rank weights, best first.

    At least `newcomers` of the kept (as many as the pool holds) are items added while
    serving, in place of the last of the others: a new item reaches the ranker (and
    exploration) before its own score could earn it a place.

    A pool no larger than `keep` passes as it came (recall order, backfill last). A catalog
    without item vectors, or a request without time left, keeps the first `keep` in recall
    order; only the latter flags the answer.
    """

    stage = Stage.PRERANK

    def __init__(self, keep: int, decay: float, newcomers: int = 0) -> None:
        self._keep = keep
        self._decay = decay
        self._newcomers = newcomers

    async def run(self, pool: Pool, ctx: RequestContext) -> Pool:
        if pool.candidates <= self._keep:
            return pool
        catalog = ctx.artifacts.catalog
        if ctx.time_for() <= 0:
            ctx.degrade(Stage.PRERANK, FailureKind.TIMEOUT, "no time left to pre-rank")
            return Pool(pool.asked, pool.positions[: self._keep])
        if catalog.vectors is None:
            return Pool(pool.asked, pool.positions[: self._keep])
        user = pool.asked.user
        signals = prerank_signals(
            pool.positions,
            user.blob[: ctx.artifacts.schema.embedding_dim],
            user.recent,
            catalog.vectors,
            user.nearby,
            self._decay,
            weighed_only=True,
            taste=user.taste,
        )
        scores = prerank_scores(signals, catalog.prerank)
        if ctx.trace is not None:
            _preranked(ctx.trace, pool.positions, scores, self._keep)
        kept = best(scores, self._keep)
        if self._newcomers and catalog.size > catalog.world_size:
            kept = keep_newcomers(kept, pool.positions, scores, catalog.world_size, self._newcomers)
        return Pool(pool.asked, pool.positions[kept])


def keep_newcomers(
    kept: npt.NDArray[np.intp],
    positions: Positions,
    scores: npt.NDArray[np.float32],
    world_size: int,
    reserved: int,
) -> npt.NDArray[np.intp]:
    """`kept`, its last places given to the best-scored items added while serving that it
    lacks, so at least `reserved` of them (as many as the pool has) reach the ranker and
    exploration: the model's cost stays `keep` rows."""
    newcomer = positions >= world_size
    missing = reserved - int(np.count_nonzero(newcomer[kept]))
    if missing <= 0:
        return kept
    outside = np.ones(len(positions), dtype=bool)
    outside[kept] = False
    waiting = np.flatnonzero(newcomer & outside)
    if not len(waiting):
        return kept
    settled = kept[~newcomer[kept]]
    brought = waiting[np.argsort(-scores[waiting], kind="stable")[: min(missing, len(settled))]]
    dropped = settled[len(settled) - len(brought) :]
    stay = kept[~np.isin(kept, dropped)]
    return np.concatenate([stay, brought])


def _preranked(
    trace: Trace, positions: Positions, scores: npt.NDArray[np.floating], keep: int
) -> None:
    order = np.argsort(-scores, kind="stable")
    record = trace.record(Stage.PRERANK)
    record.came_in, record.went_out = len(positions), min(keep, len(positions))
    cutoff = round(float(scores[order[min(keep, len(order)) - 1]]), 4)
    record.facts |= {"pool": len(positions), "keep": keep, "cutoff_score": cutoff}
    trace.followed.prerank_pool, trace.followed.prerank_keep = len(positions), keep
    at = np.flatnonzero(positions[order] == trace.about)
    if len(at):
        trace.followed.prerank_rank = int(at[0]) + 1
        trace.followed.facts["prerank_score"] = round(float(scores[order[at[0]]]), 4)
