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
    viewed: float = Field(
        default=5.0,
        ge=0,
        le=50,
        description="on an item page, how much more an item chosen with the viewed one counts: "
        "each score's odds are multiplied by exp(viewed * closeness), the closeness being its "
        "similarity to the viewed item (the neighbours the world keeps for pages) as a share "
        "of the viewed item's closest neighbour's (1 for that one, 0 off its neighbours); 0: "
        "the model's score alone. A feed has no viewed item: it is never changed by this",
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


class ExploreRule(BaseModel):
    """A share of the answer for items added while serving that few users have been shown:
    which, a bandit chooses (Thompson sampling on their rate of positives per showing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    slots: int = Field(
        default=1,
        ge=0,
        le=20,
        description="answer slots, at its end, that may go to a newcomer the ranking left out; "
        "0 turns exploration off. Only candidates the ranker scored are explored",
    )
    max_shown: int = Field(
        default=500,
        ge=1,
        description="a newcomer shown this many times has had its chance: the ranking alone "
        "decides from then on",
    )
    prior_rate: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="the rate of positives per showing a newcomer is believed to have before "
        "it is shown",
    )
    prior_weight: float = Field(
        default=20.0,
        gt=0,
        description="how many showings that belief is worth: more, and a newcomer's own "
        "events move it more slowly",
    )


class BlockRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    item_ids: frozenset[str] = frozenset()


# The candidate sources a page section may size (app/pipeline/recommend.py's order).
SOURCE_NAMES = ("ann", "viewed", "arrivals", "similar", "trending", "popular")


class PageSources(BaseModel):
    """How many candidates each source brings on one page; unset: the service's setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ann: int | None = Field(
        default=None, ge=1, le=5000, description="nearest items to the user's vector"
    )
    viewed: int | None = Field(
        default=None,
        ge=0,
        le=5000,
        description="items around the item being viewed: its neighbours, then the items "
        "nearest its vector",
    )
    arrivals: int | None = Field(default=None, ge=0, le=5000)
    similar: int | None = Field(default=None, ge=0, le=5000)
    trending: int | None = Field(default=None, ge=0, le=5000)
    popular: int | None = Field(default=None, ge=0, le=5000)

    def count(self, source: str, default: int) -> int:
        value: int | None = getattr(self, source, None)
        return default if value is None else value


class PageRule(BaseModel):
    """One page's section: what it sets replaces the file's own for that page only."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sources: PageSources = PageSources()
    objectives: ObjectivesRule | None = None
    diversity: DiversityRule | None = None
    boost: tuple[BoostRule, ...] | None = None
    explore: ExploreRule | None = None


class RerankRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    objectives: ObjectivesRule = ObjectivesRule()
    diversity: DiversityRule = DiversityRule()
    boost: tuple[BoostRule, ...] = ()
    explore: ExploreRule = ExploreRule()
    block: BlockRule = BlockRule()
    # By the schema's page names (checked when the artifacts are made): [pages.product]...
    pages: dict[str, PageRule] = Field(default_factory=dict)

    def on_page(self, page: str) -> RerankRules:
        """The rules a request on `page` is reranked by: its section over the file's own.
        The block list is the file's, on every page."""
        section = self.pages.get(page)
        if section is None:
            return self
        return RerankRules(
            objectives=section.objectives or self.objectives,
            diversity=section.diversity or self.diversity,
            boost=self.boost if section.boost is None else section.boost,
            explore=section.explore or self.explore,
            block=self.block,
        )

    def sources_on(self, page: str) -> PageSources:
        section = self.pages.get(page)
        return PageSources() if section is None else section.sources


# Rules that leave the model's order as it is, each said rather than left to the defaults
# (which a rules change could move): no objective reweighting, no category cap, no diversity,
# no boost, nothing explored, nothing blocked. Offline ranking ends in the service's rerank
# under these, so an offline figure measures the model, not the house's taste.
NEUTRAL_RULES = RerankRules(
    objectives=ObjectivesRule(like=0.0, viewed=0.0),
    diversity=DiversityRule(max_per_category=0, relevance=1.0),
    boost=(),
    explore=ExploreRule(slots=0),
    block=BlockRule(),
)


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
