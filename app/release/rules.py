"""Business rerank rules: the rules file's schema and its loading. What applies them is
rerank's selectors (app/pipeline/selectors/)."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.errors import ConfigError


class DiversityRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_per_category: int = Field(default=0, ge=0, description="0 turns the cap off")
    relevance: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="maximal marginal relevance: each next item is the one with the best "
        "relevance * score - (1 - relevance) * its closest likeness (cosine of embeddings) "
        "to an item chosen before; 1 turns it off (score alone)",
    )


class ObjectivesRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    like: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="how much more a like counts than a plain interaction: each score's odds "
        "are multiplied by (1 - like) + like * P(like | interaction), the model's like head; 0 "
        "ranks by the model's score alone (which already values likes as it was trained to)",
    )


class BoostRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    max_age_days: float = Field(gt=0)
    multiplier: float = Field(
        gt=0,
        description="what the score's odds are multiplied by (a log-odds score gains its log; "
        "a probability score, of a schema that says so, is multiplied)",
    )


class BlockRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    item_ids: frozenset[str] = frozenset()


class RerankRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    objectives: ObjectivesRule = ObjectivesRule()
    diversity: DiversityRule = DiversityRule()
    boost: tuple[BoostRule, ...] = ()
    block: BlockRule = BlockRule()


def load_rules(path: Path | None = None) -> RerankRules:
    """Parse and validate the rules file; without a path, the defaults shipped with the package."""
    try:
        if path is None:
            raw = resources.files("app.defaults").joinpath("rules.toml").read_text("utf-8")
        else:
            raw = path.read_text(encoding="utf-8")
        return RerankRules.model_validate(tomllib.loads(raw))
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ConfigError(f"rules file {path or 'default'} is invalid: {exc}") from exc
