"""One answer around the pipeline: its context on the request's budget, its trace when it is
chosen for one, the run, and what the service keeps of it (the variant, for the events that
credit the answer; what was shown, for the answer log). The HTTP edge maps a request to an
`Asking` and the `Answered` to its response."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.clients.answer_log import Shown
from app.core.events import new_answer_id
from app.pipeline.context import RequestContext, caller_shortened
from app.pipeline.trace import Trace
from app.pipeline.types import Query, Recommendation
from app.process.services import Services
from app.release.artifacts import ServingArtifacts


@dataclass(frozen=True, slots=True)
class Asking:
    """What the edge knows of a request beyond its query."""

    request_id: str
    arrived: float  # time.monotonic() when it arrived
    budget_ms: int | None  # what the caller's header asked for (capped by the service)
    trace_wanted: bool  # the caller asked for a trace and may read the ring
    # What a trace records of the request, given its budget: made only for a traced one.
    described: Callable[[float], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Answered:
    ctx: RequestContext
    answer_id: str
    result: Recommendation
    artifacts: ServingArtifacts  # the snapshot the answer was made from


async def answer(services: Services, query: Query, asking: Asking) -> Answered:
    """The pipeline's answer to `query` in `services`' world, remembered; whatever the
    pipeline raises is the caller's to map."""
    artifacts = services.served.artifacts.current
    budget_s = services.budget_s(asking.budget_ms)
    caller_shortened.set(services.shortened(budget_s))  # this request's task only
    ctx = RequestContext.on_budget(
        asking.request_id,
        arrived=asking.arrived,
        budget_s=budget_s,
        reserve_s=services.settings.reserve_s,
        artifacts=artifacts,
        metrics=services.metrics,
        user_id=query.user_id,
    )
    answer_id = new_answer_id()
    traces = services.traces
    # Forcing a trace fills the operators' ring: only for who may read it. Only a chosen
    # request pays for its trace: the others, one random draw.
    if traces is not None and traces.chosen(asking.trace_wanted):
        ctx.trace = Trace(answer_id, time.time(), asking.described(budget_s))
    result = await services.served.pipeline.run(query, ctx)
    if traces is not None and ctx.trace is not None:
        traces.keep(ctx.trace)
    answered = Answered(ctx, answer_id, result, artifacts)
    _remember(services, query, answered)
    return answered


def _remember(services: Services, query: Query, answered: Answered) -> None:
    """The answer's variant for the events that credit it, and what was shown, for the log."""
    result = answered.result
    services.events.remember_answer(
        answered.answer_id, result.model.variant.value, services.settings.answer_ttl_s
    )
    answers = services.answers
    if answers is not None and answers.wanted():
        world = services.served.stamp
        answers.shown(
            Shown(
                answered.answer_id,
                int(time.time() * 1000),
                query.user_id,
                query.moment.page,
                result.model.variant.value,
                result.model.version,
                world.world_id if world is not None else "",
                bool(answered.ctx.degraded),
                result.items,
            )
        )
