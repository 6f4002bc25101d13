"""The shape every stage has, and the one runner that times and counts them all.

A stage is a component named by its `Stage` with one async method, `run(value, ctx)`: it
takes what the stage before it made and the request context, and returns what the next one
needs. It never fails for a dependency: it falls back and flags the answer through `ctx`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from app.core.metrics import COUNTED_STAGES
from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext


class Carries(Protocol):
    """A value handed between stages: it says how many candidates it carries."""

    @property
    def candidates(self) -> int: ...


In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", bound=Carries, covariant=True)
Value = TypeVar("Value")
Made = TypeVar("Made", bound=Carries)


class Step(Protocol[In, Out]):
    @property
    def stage(self) -> Stage: ...

    async def run(self, value: In, ctx: RequestContext) -> Out: ...


async def run_step(step: Step[Value, Made], value: Value, ctx: RequestContext) -> Made:
    """Run one stage: its time into the timings and the histogram, its candidates counted."""
    with ctx.stage(step.stage):
        made = await step.run(value, ctx)
    if step.stage in COUNTED_STAGES:
        ctx.count(step.stage, made.candidates)
    return made
