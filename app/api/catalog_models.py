"""The catalog routes' bodies: items put into the catalog while serving, and withdrawn."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from app.api.models import Identifier, identifier
from app.release.arrivals import LATEST_TIME_S, float32_problem

MAX_ITEMS = 1000
# Titles and category names as ids are: Unicode, no NUL (the next world's build reads them).
Text = Annotated[
    str, AfterValidator(identifier), Field(json_schema_extra={"pattern": "^[^\\x00]*$"})
]


def _finite(values: list[float]) -> list[float]:
    # Checked against float32, the type the catalog stores them in: 1e39 is finite in
    # float64 and inf once stored.
    problem = float32_problem(values)
    if problem is not None:
        raise ValueError(problem)
    return values


class ItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    item_id: Identifier
    title: Annotated[Text, StringConstraints(max_length=512)] = ""
    categories: list[Annotated[Text, StringConstraints(min_length=1, max_length=128)]] = Field(
        min_length=1,
        max_length=16,
        description="the world's category names; the first is the item's own (caps, rules)",
    )
    published_at: int | None = Field(
        default=None, ge=0, le=LATEST_TIME_S, description="unix seconds; absent: now"
    )
    dense: dict[str, float] = Field(
        default_factory=dict,
        description="the schema's item dense features by name; one left out is 0",
    )
    embedding: list[float] | None = Field(
        default=None,
        description="the item's vector (embedding_dim numbers); absent: the world's guess "
        "from its categories, title and dense features",
    )

    @field_validator("embedding")
    @classmethod
    def _finite_embedding(cls, value: list[float] | None) -> list[float] | None:
        return None if value is None else _finite(value)

    @field_validator("dense")
    @classmethod
    def _finite_dense(cls, value: dict[str, float]) -> dict[str, float]:
        _finite(list(value.values()))
        return value


class ItemsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[ItemIn] = Field(min_length=1, max_length=MAX_ITEMS)


class WithdrawalsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    item_ids: list[Identifier] = Field(min_length=1, max_length=MAX_ITEMS)


class ItemPut(BaseModel):
    item_id: str
    position: int
    guessed: bool = Field(description="its vector is the world's guess from its attributes")


class CatalogState(BaseModel):
    """What this process holds of the change log: two processes with one digest serve
    the same catalog (the same items at the same positions, the same ones withdrawn)."""

    batch: int = Field(description="the last change log batch applied")
    world_items: int
    added: int
    withdrawn: int = Field(description="items withdrawn now")
    room: int = Field(description="items that may still be added")
    digest: str


class CatalogChanged(BaseModel):
    request_id: str
    batch: int = Field(description="the change log's number for this change")
    items: list[ItemPut] = Field(default_factory=list)
    withdrawn: list[str] = Field(default_factory=list)
