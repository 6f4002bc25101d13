"""Dense features derived from the interactions, by name, from a registry.

The world's schema says which features it wants (user_dense, item_dense); each name here
has the function that computes it from a log, what it means and its scale. Times are
measured against the log's last timestamp, never the wall clock, so a rebuild of the same
log gives the same features.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.world.schema import FeatureSchema
from recsys_tools.world.read.items import ItemInfo
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import IntArray
from recsys_tools.world.read.times import NO_TIME

FloatArray = npt.NDArray[np.float64]
DAY = 86_400.0
# Ages and absences are read on a one-month scale: exp(-days / 30).
DECAY_DAYS = 30.0
# An item's mean weight counts as if it had this many more interactions at the global mean.
WEIGHT_PRIOR = 5.0


@dataclass(frozen=True, slots=True)
class Totals:
    """What the features read of the whole part: its time span, its weights, its positives.

    Either engine counts it (this module from a log in memory, the Spark engine as jobs); the
    formulas below are the one definition of each feature, so both give the same numbers.
    """

    first_time: int  # 0 for an empty part
    last_time: int
    total_positives: int
    top_user_positives: float
    top_item_positives: float
    # The weights' lowest, highest and mean; None where the log has none (or no rows).
    weights: tuple[float, float, float] | None
    n_categories: int


@dataclass(frozen=True, slots=True)
class UserTallies:
    """Per user: rows, positives, first and last time (0 where no rows), the distinct
    categories their positives span."""

    rows: IntArray
    positives: FloatArray
    first: IntArray
    last: IntArray
    categories: FloatArray


@dataclass(frozen=True, slots=True)
class ItemTallies:
    """Per item: rows, positives, first time (0 where no rows), the sum of weights."""

    rows: IntArray
    positives: FloatArray
    first: IntArray
    weight_sum: FloatArray


@dataclass(frozen=True, slots=True)
class ItemFacts:
    tallies: ItemTallies
    items: ItemInfo
    totals: Totals


@dataclass(frozen=True, slots=True)
class UserFacts:
    tallies: UserTallies
    totals: Totals


@dataclass(frozen=True, slots=True)
class Derivation:
    compute: Callable[[Any], FloatArray]  # ItemFacts or UserFacts
    meaning: str
    scale: str


def interactions_schema_path() -> Path:
    """The packaged schema for worlds built from an interaction log."""
    ref = (
        resources.files("recsys_tools.world.learn")
        .joinpath("schemas")
        .joinpath("interactions.json")
    )
    return Path(str(ref))


def _positives_per(index: IntArray, log: InteractionLog, size: int) -> FloatArray:
    counts: FloatArray = np.bincount(index[log.positive], minlength=size).astype(np.float64)
    return counts


def _log_scaled(counts: FloatArray, top: float) -> FloatArray:
    scaled: FloatArray = np.log1p(counts) / np.log1p(top) if top > 0 else np.zeros_like(counts)
    return scaled


def _decay(seconds: FloatArray) -> FloatArray:
    decayed: FloatArray = np.exp(-np.maximum(seconds, 0.0) / DAY / DECAY_DAYS)
    return decayed


def _first_time(index: IntArray, times: IntArray, size: int, empty: int) -> IntArray:
    first = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, index, times)
    first[first == np.iinfo(np.int64).max] = empty
    return first


def _last_time(index: IntArray, times: IntArray, size: int, empty: int) -> IntArray:
    last = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, index, times)
    last[last == np.iinfo(np.int64).min] = empty
    return last


def totals(log: InteractionLog) -> Totals:
    weights = None
    if log.weight is not None and len(log.weight):
        weights = (float(log.weight.min()), float(log.weight.max()), float(log.weight.mean()))
    users, items = (
        _positives_per(log.user, log, log.n_users),
        _positives_per(log.item, log, log.n_items),
    )
    return Totals(
        first_time=int(log.time.min()) if len(log.time) else 0,
        last_time=int(log.time.max()) if len(log.time) else 0,
        total_positives=int(log.positive.sum()),
        top_user_positives=float(users.max()) if len(users) else 0.0,
        top_item_positives=float(items.max()) if len(items) else 0.0,
        weights=weights,
        n_categories=len(log.items.category_names),
    )


def item_tallies(log: InteractionLog) -> ItemTallies:
    weight_sum: FloatArray = np.zeros(log.n_items)
    if log.weight is not None:
        weight_sum = np.bincount(log.item, weights=log.weight, minlength=log.n_items).astype(
            np.float64
        )
    return ItemTallies(
        rows=np.bincount(log.item, minlength=log.n_items),
        positives=_positives_per(log.item, log, log.n_items),
        first=_first_time(log.item, log.time, log.n_items, 0),
        weight_sum=weight_sum,
    )


def _category_breadth_counts(log: InteractionLog) -> FloatArray:
    items = log.items
    n_categories = len(items.category_names)
    if n_categories == 0:
        return np.zeros(log.n_users)
    users, item_of = log.user[log.positive], log.item[log.positive]
    per_row = np.diff(items.category_offsets)[item_of]
    starts = np.repeat(items.category_offsets[:-1][item_of], per_row)
    within = np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    pairs = np.repeat(users, per_row) * n_categories + items.category_codes[starts + within]
    distinct: FloatArray = np.bincount(
        np.unique(pairs) // n_categories, minlength=log.n_users
    ).astype(np.float64)
    return distinct


def user_tallies(log: InteractionLog) -> UserTallies:
    return UserTallies(
        rows=np.bincount(log.user, minlength=log.n_users),
        positives=_positives_per(log.user, log, log.n_users),
        first=_first_time(log.user, log.time, log.n_users, 0),
        last=_last_time(log.user, log.time, log.n_users, 0),
        categories=_category_breadth_counts(log),
    )


def published_from(tallies: ItemTallies, items: ItemInfo, all_totals: Totals) -> IntArray:
    """The item table's publish time, else the item's first interaction in the log.

    An item with neither is taken to be as old as the log: nothing says it is new.
    """
    first = np.where(tallies.rows > 0, tallies.first, all_totals.first_time).astype(np.int64)
    if items.published is None:
        return first
    given = items.published
    return np.where(given == NO_TIME, first, given)


def category_codes(items: ItemInfo) -> IntArray:
    """Each item's first listed category; items without one share the code after the last."""
    offsets = items.category_offsets
    has_category = offsets[1:] > offsets[:-1]
    codes = np.full(items.size, len(items.category_names), dtype=np.int64)
    codes[has_category] = items.category_codes[offsets[:-1][has_category]]
    return codes


def item_attributes(items: ItemInfo) -> dict[str, npt.NDArray[np.str_]]:
    """The words a client may ask for with each item: its title, its categories as A|B."""
    attributes: dict[str, npt.NDArray[np.str_]] = {}
    if items.titles is not None:
        attributes["title"] = items.titles
    if items.category_names:
        names = np.asarray(items.category_names, dtype=np.str_)
        offsets = items.category_offsets
        attributes["categories"] = np.asarray(
            [
                "|".join(names[items.category_codes[offsets[i] : offsets[i + 1]]].tolist())
                for i in range(items.size)
            ],
            dtype=np.str_,
        )
    return attributes


def _item_of_category_entry(items: ItemInfo) -> IntArray:
    """For each (item, category) entry, the item it belongs to."""
    return np.repeat(np.arange(items.size), np.diff(items.category_offsets))


# Items


def _log_popularity(facts: ItemFacts) -> FloatArray:
    return _log_scaled(facts.tallies.positives, facts.totals.top_item_positives)


def _freshness(facts: ItemFacts) -> FloatArray:
    published = published_from(facts.tallies, facts.items, facts.totals)
    return _decay(float(facts.totals.last_time) - published.astype(np.float64))


def _mean_weight(facts: ItemFacts) -> FloatArray:
    size = facts.items.size
    if facts.totals.weights is None:
        return np.full(size, 0.5)
    low, high, mean = facts.totals.weights
    if high <= low:
        return np.full(size, 0.5)
    tallies = facts.tallies
    shrunk = (tallies.weight_sum + WEIGHT_PRIOR * mean) / (tallies.rows + WEIGHT_PRIOR)
    scaled: FloatArray = (shrunk - low) / (high - low)
    return scaled


def _category_share(facts: ItemFacts) -> FloatArray:
    items, total = facts.items, facts.totals.total_positives
    n_categories = len(items.category_names)
    if n_categories == 0 or total == 0:
        return np.zeros(items.size)
    # A positive on an item in two categories counts once in each.
    owners = _item_of_category_entry(items)
    in_category = np.bincount(
        items.category_codes, weights=facts.tallies.positives[owners], minlength=n_categories
    )
    share = in_category / total
    best = np.zeros(items.size)
    np.maximum.at(best, owners, share[items.category_codes])
    return best


# Users


def _activity(facts: UserFacts) -> FloatArray:
    return _log_scaled(facts.tallies.positives, facts.totals.top_user_positives)


def _tenure(facts: UserFacts) -> FloatArray:
    span = float(facts.totals.last_time - facts.totals.first_time)
    if span <= 0:
        return np.zeros(len(facts.tallies.rows))
    tenure: FloatArray = (facts.tallies.last - facts.tallies.first).astype(np.float64) / span
    return tenure


def _category_breadth(facts: UserFacts) -> FloatArray:
    n_categories = facts.totals.n_categories
    if n_categories == 0:
        return np.zeros(len(facts.tallies.rows))
    breadth: FloatArray = facts.tallies.categories / n_categories
    return breadth


def _recency(facts: UserFacts) -> FloatArray:
    now = facts.totals.last_time
    last = np.where(facts.tallies.rows > 0, facts.tallies.last, now)
    return _decay((now - last).astype(np.float64))


ITEM_FEATURES: Mapping[str, Derivation] = {
    "log_popularity": Derivation(
        _log_popularity,
        "how many positives the item has, log-scaled",
        "log1p(positives) / log1p(the most any item has): 0 (none) to 1 (the most popular)",
    ),
    "freshness": Derivation(
        _freshness,
        "how recently the item was published (or first interacted with, without a publish "
        "time), measured at the log's last timestamp",
        "exp(-age in days / 30): 1 new, 0.37 a month old",
    ),
    "mean_weight": Derivation(
        _mean_weight,
        "the item's mean weight (e.g. rating), shrunk toward the global mean by a prior of "
        "5 interactions",
        "0 (the log's lowest weight) to 1 (its highest); 0.5 when the log has no weights",
    ),
    "category_share": Derivation(
        _category_share,
        "the share of all positives that fall in the item's categories (its largest one)",
        "0 (no category, or no positives there) to 1 (every positive)",
    ),
}

USER_FEATURES: Mapping[str, Derivation] = {
    "activity": Derivation(
        _activity,
        "how many positives the user has, log-scaled",
        "log1p(positives) / log1p(the most any user has): 0 to 1 (the most active)",
    ),
    "tenure": Derivation(
        _tenure,
        "the span between the user's first and last interaction",
        "0 (one moment) to 1 (the log's whole span)",
    ),
    "category_breadth": Derivation(
        _category_breadth,
        "how many categories the user's positives span",
        "distinct categories / all categories: 0 (none, or no categories) to 1 (every one)",
    ),
    "recency": Derivation(
        _recency,
        "how recently the user last interacted, measured at the log's last timestamp",
        "exp(-days since the last interaction / 30): 1 active now, 0.37 a month ago",
    ),
}


def check_derivable(schema: FeatureSchema) -> None:
    """Fail before any work when the schema wants a feature no one can compute from a log."""
    for side, wanted, registry in (
        ("user_dense", schema.user_dense, USER_FEATURES),
        ("item_dense", schema.item_dense, ITEM_FEATURES),
    ):
        unknown = [name for name in wanted if name not in registry]
        if unknown:
            raise ConfigError(
                f"the schema's {side} names {', '.join(unknown)}, which a log cannot give; "
                f"derivable: {', '.join(registry)} (start from {interactions_schema_path()})"
            )


def _dense(
    facts: Any, names: tuple[str, ...], registry: Mapping[str, Derivation], rows: int
) -> npt.NDArray[np.float32]:
    if not names:
        return np.zeros((rows, 0), dtype=np.float32)
    return np.stack([registry[name].compute(facts) for name in names], axis=1).astype(np.float32)


def item_dense_from(facts: ItemFacts, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    check_derivable(schema)
    return _dense(facts, schema.item_dense, ITEM_FEATURES, facts.items.size)


def user_dense_from(facts: UserFacts, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    check_derivable(schema)
    return _dense(facts, schema.user_dense, USER_FEATURES, len(facts.tallies.rows))


def item_dense(log: InteractionLog, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    return item_dense_from(ItemFacts(item_tallies(log), log.items, totals(log)), schema)


def user_dense(log: InteractionLog, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    return user_dense_from(UserFacts(user_tallies(log), totals(log)), schema)
