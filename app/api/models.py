"""The HTTP API's request and response bodies.

Requests are validated strictly: a number sent as a string, a float or a boolean where an
integer belongs, or a string where a boolean belongs, is refused rather than converted.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic.config import JsonDict

from app.core.events import EventType, keyable_user
from app.core.storable import FLOAT32_MAX, identifier_problem, unicode_problem
from app.core.vocabulary import Variant, WorldRole
from app.pipeline.types import Moment, Query
from app.world.attributes import ATTRIBUTE_NAMES, AttributeName
from app.world.schema import NAME


def encodable(value: str) -> str:
    # JSON may escape a lone surrogate (\ud800); no UTF-8 key, id or text can hold one.
    problem = unicode_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def identifier(value: str) -> str:
    problem = identifier_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _keyable(value: str) -> str:
    if not keyable_user(value):
        raise ValueError("must not hold { or } (the user's Redis keys carry it as their hash tag)")
    return value


Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128),
    AfterValidator(identifier),
    Field(json_schema_extra={"pattern": "^[^\\x00]*$"}),
]
# The brace rule in the document too (as a pattern), so a generated client knows it; the
# validator says it in words.
UserIdentifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128),
    AfterValidator(identifier),
    AfterValidator(_keyable),
    Field(json_schema_extra={"pattern": "^[^{}\\x00]*$"}),
]
ShortLabel = Annotated[str, StringConstraints(max_length=32)]

MAX_EXCLUDED = 500
REQUEST_ID_HEADER = "x-request-id"
BUDGET_HEADER = "x-request-timeout-ms"
# Asks for this request to be traced (with the debug pages on): any value but 0.
TRACE_HEADER = "X-Recsys-Trace"


class ClientContext(BaseModel):
    """What the frontend knows about the moment of the request; all of it optional."""

    model_config = ConfigDict(extra="forbid", strict=True)
    device: ShortLabel = Field(
        default="other", description="mobile, desktop, tablet...; unknown values count as other"
    )
    page: ShortLabel = Field(
        default="other",
        description="home, product, search, cart...: the schema's pages, each with its "
        "section of the rules file; unknown: other",
    )
    item_id: Identifier | None = Field(
        default=None,
        description="the item the page shows (an item page): recall starts around it, the "
        "ranking takes it as the latest signal, and it is never returned; an id the catalog "
        "lacks is ignored (the feed is served)",
    )
    locale: ShortLabel = Field(default="other", description="BCP 47 tag such as en-US")
    hour: int | None = Field(
        default=None, ge=0, le=23, description="hour of the day, UTC; default: now"
    )
    weekday: int | None = Field(
        default=None, ge=0, le=6, description="0 is Monday, UTC; default: today"
    )


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    user_id: UserIdentifier
    context: ClientContext = Field(default_factory=ClientContext)
    num_items: int = Field(default=20, ge=1, le=200)
    exclude_item_ids: list[Identifier] = Field(
        default_factory=list, max_length=MAX_EXCLUDED, description="ids never to return"
    )
    debug: bool = Field(default=False, description="add the time spent in each stage")
    attributes: list[AttributeName] = Field(
        default_factory=list,
        max_length=len(ATTRIBUTE_NAMES),
        description="item attributes to return with each item; none unless asked for. "
        "null where the world's catalog has no such attribute",
    )

    def query(self) -> Query:
        context = self.context
        return Query(
            user_id=self.user_id,
            num_items=self.num_items,
            exclude_item_ids=frozenset(self.exclude_item_ids),
            moment=Moment(
                context.device, context.page, context.locale, context.hour, context.weekday
            ),
            viewed_item_id=context.item_id,
        )


MAX_EVENTS = 500


# A rating carries its value: said in the schema too, so a client generated from it knows.
_RATING_HAS_A_VALUE: JsonDict = {
    "if": {"properties": {"type": {"const": "rating"}}, "required": ["type"]},
    "then": {"properties": {"value": {"type": "number"}}, "required": ["value"]},
}


class EventIn(BaseModel):
    """One thing a user did. A retried event with the same `event_id` changes nothing."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_RATING_HAS_A_VALUE)
    event_id: Identifier = Field(description="unique per user; a repeat is applied once")
    user_id: UserIdentifier
    item_id: Identifier
    # Not strict: the body is parsed JSON, where an enum's value is a string.
    type: EventType = Field(strict=False)
    value: float | None = Field(
        default=None, description="the rating, for `rating` (4 or more counts as a positive)"
    )
    ts: int | None = Field(
        default=None,
        ge=0,
        le=2**53,
        description="when it happened, ms since the epoch; default: now. Further ahead than "
        "RECSYS_EVENT_MAX_FUTURE_MS is not applied (listed in `future`), further back than "
        "RECSYS_EVENT_MAX_AGE_MS neither (listed in `stale`)",
    )
    answer_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(encodable)]
        | None
    ) = Field(
        default=None,
        description="the `answer_id` of the answer the item was in: a click, like or purchase "
        "credits that answer's variant. An id the service did not issue credits nothing",
    )
    request_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=64), AfterValidator(encodable)]
        | None
    ) = Field(
        default=None,
        deprecated=True,
        description="read as `answer_id` (its name before answers had ids of their own)",
    )

    @property
    def answer(self) -> str | None:
        # The old name, read without the warning its deprecation raises on every access.
        legacy: str | None = self.__dict__.get("request_id")
        return self.answer_id if self.answer_id is not None else legacy

    @model_validator(mode="after")
    def _value_fits_the_type(self) -> EventIn:
        # Within float32, the type the archive keeps it in.
        if self.value is not None and not (
            math.isfinite(self.value) and abs(self.value) <= FLOAT32_MAX
        ):
            raise ValueError(f"value must be a finite number of at most {FLOAT32_MAX:.4g}")
        if self.type is EventType.RATING and self.value is None:
            raise ValueError("a rating needs its value")
        return self


class EventsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS)


class EventsAccepted(BaseModel):
    request_id: str
    accepted: int = Field(description="events appended to the event log, durable in Redis")
    unknown_items: list[int] = Field(
        description="positions in `events` of those whose item the catalog lacks: counted, "
        "never applied"
    )
    future: list[int] = Field(
        description="positions in `events` of those stamped too far ahead of this host's "
        "clock: counted, never applied"
    )
    stale: list[int] = Field(
        default_factory=list,
        description="positions in `events` of those stamped further back than "
        "RECSYS_EVENT_MAX_AGE_MS: counted, never applied",
    )
    uncredited: int = Field(
        default=0,
        description="events naming an answer id the service does not issue: accepted, "
        "credited to no variant",
    )


class RecommendedItem(BaseModel):
    item_id: str
    score: float | None = Field(
        description="the ranking model's score after the rules: a log-odds (any real number, "
        "higher is better; a world whose schema says its model answers a probability: 0 "
        "to 1); null for an item that filled a degraded answer without being scored"
    )
    rank: int
    attributes: dict[str, str | None] | None = Field(
        default=None, description="only the attributes the request asked for"
    )


class ModelInfo(BaseModel):
    name: str
    version: str | None = Field(
        description="the version Triton says scored this answer; null when Triton did not "
        "(`degraded` says why)"
    )
    variant: Variant = Field(
        description="stable, canary (this user is in the canary's share), or fallback"
    )


class WorldInfo(BaseModel):
    id: str = Field(description="the world's id (its build stamp); empty for an unstamped world")
    role: WorldRole = Field(
        description="stable, or candidate: this user is in the share of the candidate world "
        "served beside the stable one (RECSYS_WORLDS_FILE); every answer is wholly one world's"
    )


class RecommendResponse(BaseModel):
    request_id: str
    answer_id: str = Field(
        description="this answer's id, made by the service: events on its items send it as "
        "`answer_id` to credit the variant that made it; the trace's id with the debug pages on"
    )
    user_id: str
    items: list[RecommendedItem]
    model: ModelInfo
    artifacts: str = Field(
        description="names the index, catalog and rules that made this answer: the same in "
        "every answer until a reload changes them"
    )
    world: WorldInfo
    cold_start: bool = Field(description="the user had no stored features; defaults were used")
    degraded: list[str] = Field(description="stage:reason for every stage that fell back")
    timings_ms: dict[str, float] | None = Field(default=None, description="only with debug")


class ErrorField(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error the API returns, whatever its status."""

    error: str = Field(description="a fixed code: invalid_request, invalid_json, overloaded...")
    message: str
    fields: list[ErrorField] = Field(
        default_factory=list, description="the offending fields, at most 20"
    )
    request_id: str


class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str = Field(description="ready or not_ready")
    checks: dict[str, bool] = Field(description="each part and whether it passed")
    failing: list[str] = Field(description="the checks that make the instance not ready")
    breakers: dict[str, str] = Field(description="circuit breaker state per dependency")


class Release(BaseModel):
    """What this worker serves: its release generation, artifacts and routed versions."""

    generation: int = Field(description="1 at start, one more per reload or rollback")
    artifacts: str
    world_id: str
    stable: str = Field(description="the stable version (the latest ready, when unpinned)")
    canary: str = Field(description="the canary version; empty for none")
    canary_percent: float
    shadow: str = Field(description="the shadow version; empty for none")


class CandidateWorld(BaseModel):
    """A world to serve beside the stable one, to a share of users."""

    model_config = ConfigDict(extra="forbid")

    artifacts_dir: str = Field(min_length=1, description="the world's directory on this host")
    key_prefix: str = Field(
        min_length=1,
        pattern=r"^[^{}]+$",
        description="its keys in Redis (loaded there by `recsys load-redis --prefix`)",
    )
    model_name: str | None = Field(
        default=None,
        pattern=f"^{NAME.pattern}$",
        description="its model on Triton (letters, digits, _ and -, at most 64); default: "
        "its schema's",
    )
    percent: float = Field(ge=0, le=100, description="the share of users it answers")


class WorldsState(BaseModel):
    """The worlds this worker serves."""

    stable: str = Field(description="the stable world's id")
    stable_dir: str
    candidate: str = Field(description="the candidate world's id; empty for none")
    candidate_dir: str
    percent: float = Field(description="the share of users the candidate answers")
    memory_bytes: int = Field(description="the candidate's estimated memory; 0 for none")
