"""Business rerank rules: the config file's model and the pure function that applies it."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.errors import ConfigError
from app.release.schema import ScoreScale


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


@dataclass(frozen=True, slots=True)
class Selection:
    """Positions into the candidate arrays, best first, and their final scores."""

    positions: npt.NDArray[np.intp]
    scores: npt.NDArray[np.float32]


def log_factors(
    likes: npt.NDArray[np.float32] | None, age_days: npt.NDArray[np.float32], rules: RerankRules
) -> npt.NDArray[np.float32]:
    """The log of what the rules multiply each candidate by: the like head's value where the
    rules weigh it and the model gave it (a candidate without one, NaN, keeps 1), times
    every boost whose age window the item falls in."""
    factors = np.zeros(len(age_days), dtype=np.float64)
    weight = rules.objectives.like
    if weight > 0 and likes is not None:
        value = np.where(np.isnan(likes), 1.0, (1 - weight) + weight * likes)
        # A like probability of exactly 0 with a weight of 1 would be log(0): the item
        # falls to the bottom of the scored ones, not out of them.
        factors += np.log(np.maximum(value, np.finfo(np.float32).tiny))
    for boost in rules.boost:
        factors[age_days <= boost.max_age_days] += math.log(boost.multiplier)
    return factors.astype(np.float32)


def adjusted_scores(
    scores: npt.NDArray[np.float32],
    factors: npt.NDArray[np.float32],
    scale: ScoreScale,
) -> npt.NDArray[np.float32]:
    """The scores with the rules' factors applied: a log-odds score gains their log (the
    odds are multiplied, the order never saturates); a probability is multiplied."""
    if scale == "log_odds":
        return (scores + factors).astype(np.float32, copy=False)
    return (scores * np.exp(factors)).astype(np.float32, copy=False)


def rank_within_group(groups: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """For each element, how many earlier elements share its group (0 for the first)."""
    by_group = np.argsort(groups, kind="stable")
    sorted_groups = groups[by_group]
    starts = np.r_[True, sorted_groups[1:] != sorted_groups[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(groups)), 0))
    ranks = np.empty(len(groups), dtype=np.intp)
    ranks[by_group] = np.arange(len(groups)) - group_start
    return ranks


def _best_first(
    candidates: npt.NDArray[np.intp],
    final: npt.NDArray[np.float32],
    tie_keys: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
    return candidates[np.lexsort((tie_keys[candidates], -final[candidates]))]


def _head(
    scored: npt.NDArray[np.intp], final: npt.NDArray[np.float32], size: int
) -> npt.NDArray[np.intp]:
    """The scored candidates at or above the `size`-th best score, ties included: in the
    final order they come first, whatever the tie-break."""
    if len(scored) <= size:
        return scored
    values = final[scored]
    cut = len(values) - size
    threshold = np.partition(values, cut)[cut]
    head: npt.NDArray[np.intp] = scored[values >= threshold]
    return head


def _capped(
    order: npt.NDArray[np.intp], categories: npt.NDArray[np.int64], cap: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    within_cap = rank_within_group(categories[order]) < cap
    return order[within_cap], order[~within_cap]


# How far past n_items the sorted head reaches: enough, nearly always, for the category cap
# to fill the answer from the head alone; when it cannot, every candidate is sorted.
HEAD_FACTOR = 4
# How far past n_items maximal marginal relevance looks for items unlike those chosen.
MMR_FACTOR = 3


def unlike_chosen(
    order: npt.NDArray[np.intp],
    final: npt.NDArray[np.float32],
    vectors: npt.NDArray[np.float32],
    n_items: int,
    relevance: float,
) -> npt.NDArray[np.intp]:
    """`order` with its first n_items chosen again by maximal marginal relevance among the
    first MMR_FACTOR * n_items scored ones: each next item is the one whose score (scaled to
    0-1 over those) most outweighs its likeness to the items chosen before it."""
    head = order[: MMR_FACTOR * n_items]
    head = head[~np.isnan(final[head])]
    if relevance >= 1.0 or len(head) <= 1:
        return order
    unit = vectors[head].astype(np.float32)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    values = final[head].astype(np.float64)
    spread = float(values.max() - values.min())
    gain = relevance * ((values - values.min()) / spread if spread > 0 else np.ones_like(values))
    picked = [0]
    # Likeness below zero counts as none: an item opposite to one chosen is not worth more
    # than one merely unrelated to it.
    closest = np.maximum(unit @ unit[0], 0.0)
    for _ in range(min(n_items, len(head)) - 1):
        value = gain - (1.0 - relevance) * closest
        value[picked] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        np.maximum(closest, unit @ unit[best], out=closest)
    chosen = head[picked]
    rest = order[~np.isin(order, chosen)]
    return np.concatenate([chosen, rest])


def rerank(
    tie_keys: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float32],
    categories: npt.NDArray[np.int64],
    age_days: npt.NDArray[np.float32],
    rules: RerankRules,
    n_items: int,
    vectors: npt.NDArray[np.float32] | None = None,
    likes: npt.NDArray[np.float32] | None = None,
    scale: ScoreScale = "log_odds",
) -> Selection:
    """Choose the top n_items candidates.

    Applies boosts, orders by score with ties broken by `tie_keys` ascending so equal scores
    always come out in the same order, keeps at most `max_per_category` of a category, and
    backfills from the capped-out items in score order when there are not enough others to
    fill the answer. Unscored candidates (NaN) come after every scored one, in input order.

    Only the head of the order is sorted when it decides the answer: a candidate's place
    under the cap depends on the candidates before it alone, so when the head holds
    n_items within the cap, the rest of the order cannot change them.

    With `vectors` (the candidates' embeddings) and a diversity relevance under 1, the
    answer is chosen from the head of that order by maximal marginal relevance. With
    `likes` (the model's like head) and an [objectives] like weight, each score is first
    valued by it. `scale` says what the scores are (the schema's model.score): the rules'
    multipliers multiply a probability, and a log-odds score's odds.
    """
    final = adjusted_scores(scores, log_factors(likes, age_days, rules), scale)
    unscored = np.isnan(final)
    scored = np.flatnonzero(~unscored)
    cap = rules.diversity.max_per_category
    head = _best_first(_head(scored, final, HEAD_FACTOR * n_items), final, tie_keys)
    if len(head) < len(scored):
        kept = _capped(head, categories, cap)[0] if cap > 0 else head
        if len(kept) >= n_items:
            chosen = _diverse(kept, final, vectors, rules, n_items)[:n_items]
            return Selection(positions=chosen, scores=final[chosen])
    order = np.concatenate([_best_first(scored, final, tie_keys), np.flatnonzero(unscored)])
    if cap > 0:
        order = np.concatenate(_capped(order, categories, cap))
    chosen = _diverse(order, final, vectors, rules, n_items)[:n_items]
    return Selection(positions=chosen, scores=final[chosen])


def _diverse(
    order: npt.NDArray[np.intp],
    final: npt.NDArray[np.float32],
    vectors: npt.NDArray[np.float32] | None,
    rules: RerankRules,
    n_items: int,
) -> npt.NDArray[np.intp]:
    relevance = rules.diversity.relevance
    if vectors is None or relevance >= 1.0:
        return order
    return unlike_chosen(order, final, vectors, n_items, relevance)
