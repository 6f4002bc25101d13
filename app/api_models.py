"""The HTTP API's request and response bodies."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=128, strip_whitespace=True)]
ShortLabel = Annotated[str, StringConstraints(max_length=32, strip_whitespace=True)]

MAX_EXCLUDED = 500


class ClientContext(BaseModel):
    """What the frontend knows about the moment of the request; all of it optional."""

    model_config = ConfigDict(extra="forbid")
    device: ShortLabel = Field(default="other", description="mobile, desktop, tablet...")
    page: ShortLabel = Field(default="other", description="home, product, search, cart...")
    locale: ShortLabel = Field(default="other", description="BCP 47 tag such as en-US")
    hour: int | None = Field(default=None, ge=0, le=23, description="local hour; default now")
    weekday: int | None = Field(default=None, ge=0, le=6, description="0 is Monday; default now")


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: Identifier
    context: ClientContext = Field(default_factory=ClientContext)
    num_items: int = Field(default=20, ge=1, le=200)
    exclude_item_ids: list[Identifier] = Field(default_factory=list, max_length=MAX_EXCLUDED)
    debug: bool = False


class RecommendedItem(BaseModel):
    item_id: str
    score: float
    rank: int


class ModelInfo(BaseModel):
    name: str
    version: str


class RecommendResponse(BaseModel):
    request_id: str
    user_id: str
    items: list[RecommendedItem]
    model: ModelInfo
    cold_start: bool = Field(description="the user had no stored features; defaults were used")
    degraded: list[str] = Field(description="stage:reason for every stage that fell back")
    timings_ms: dict[str, float] | None = Field(default=None, description="only with debug")


class ErrorField(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str
    message: str
    fields: list[ErrorField] = Field(default_factory=list)
    request_id: str | None = None
