"""A bound on the work a bad request body can cause before it is refused.

Validation reports every problem, and building the report costs far more than finding it:
a 128 KB body of ten thousand unknown keys takes pydantic and FastAPI about 50 ms to list,
all but 20 of them then thrown away. A large body is looked over first, for what makes
many errors: unknown keys, and a list over its length. When it holds more of them than an
answer lists, it is refused with the first ones, in the same error shape, without the full
validation ever running. Other bodies go to validation, which lists everything wrong.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from app.api.catalog_models import ItemIn, ItemsIn
from app.api.models import ClientContext, ErrorField, EventIn, EventsRequest, RecommendRequest

# Below this a body holds too few keys or items to make validation expensive.
LOOK_OVER_BYTES = 4096
MAX_REPORTED = 20
MAX_NAME_CHARS = 64


def shown(name: str) -> str:
    """A client's key as an error names it: cut, so a huge key cannot make a huge answer."""
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 3] + "..."


def _unknown_keys(value: Any, model: type[BaseModel], prefix: str) -> list[ErrorField]:
    if not isinstance(value, dict):
        return []
    known = model.model_fields
    return [
        ErrorField(field=shown(f"{prefix}{key}"), message="Extra inputs are not permitted")
        for key in value
        if key not in known
    ]


def _long_lists(body: dict[str, Any], model: type[BaseModel]) -> list[ErrorField]:
    problems = []
    for name, field in model.model_fields.items():
        value = body.get(name)
        limit = next((m.max_length for m in field.metadata if hasattr(m, "max_length")), None)
        if isinstance(value, list) and limit is not None and len(value) > limit:
            message = f"List should have at most {limit} items after validation, not {len(value)}"
            problems.append(ErrorField(field=name, message=message))
    return problems


# Each body's nested objects: one object under a key, or a list of them.
NESTED: dict[type[BaseModel], dict[str, type[BaseModel]]] = {
    RecommendRequest: {"context": ClientContext},
    EventsRequest: {"events": EventIn},
    ItemsIn: {"items": ItemIn},
}


def _nested_unknown_keys(body: dict[str, Any], model: type[BaseModel]) -> list[ErrorField]:
    unknown: list[ErrorField] = []
    for key, inner in NESTED.get(model, {}).items():
        value = body.get(key)
        if isinstance(value, list):
            for n, element in enumerate(value):
                unknown += _unknown_keys(element, inner, f"{key}.{n}.")
                if len(unknown) > MAX_REPORTED:
                    break
        else:
            unknown += _unknown_keys(value, inner, f"{key}.")
    return unknown


def many_errors(
    body: bytes, model: type[BaseModel] = RecommendRequest
) -> tuple[list[ErrorField], int]:
    """For a large body that would make many errors, the first MAX_REPORTED and how many
    there are (at least); ([], 0) when validation should look at it."""
    if len(body) < LOOK_OVER_BYTES:
        return [], 0
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # nested past the parser's depth: invalid too
        return [], 0  # validation reports it as invalid JSON, one error
    if not isinstance(parsed, dict):
        return [], 0
    long_lists = _long_lists(parsed, model)
    unknown = _unknown_keys(parsed, model, "")
    unknown += _nested_unknown_keys(parsed, model)
    if not long_lists and len(unknown) <= MAX_REPORTED:
        return [], 0
    problems = long_lists + unknown
    return problems[:MAX_REPORTED], len(problems)
