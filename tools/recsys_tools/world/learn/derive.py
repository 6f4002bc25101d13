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

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.release.schema import FeatureSchema
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
class Derivation:
    compute: Callable[[InteractionLog], FloatArray]
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


def _log_scaled(counts: FloatArray) -> FloatArray:
    top = float(counts.max()) if len(counts) else 0.0
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


def _last_timestamp(log: InteractionLog) -> int:
    return int(log.time.max()) if len(log.time) else 0


def published_at(log: InteractionLog) -> IntArray:
    """The item table's publish time, else the item's first interaction in the log.

    An item with neither is taken to be as old as the log: nothing says it is new.
    """
    oldest = int(log.time.min()) if len(log.time) else 0
    first = _first_time(log.item, log.time, log.n_items, oldest)
    if log.items.published is None:
        return first
    given = log.items.published
    return np.where(given == NO_TIME, first, given)


def popularity(log: InteractionLog) -> npt.NDArray[np.float32]:
    return _positives_per(log.item, log, log.n_items).astype(np.float32)


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


def _log_popularity(log: InteractionLog) -> FloatArray:
    return _log_scaled(_positives_per(log.item, log, log.n_items))


def _freshness(log: InteractionLog) -> FloatArray:
    age = float(_last_timestamp(log)) - published_at(log).astype(np.float64)
    return _decay(age)


def _mean_weight(log: InteractionLog) -> FloatArray:
    if log.weight is None or len(log.weight) == 0:
        return np.full(log.n_items, 0.5)
    low, high = float(log.weight.min()), float(log.weight.max())
    if high <= low:
        return np.full(log.n_items, 0.5)
    sums = np.bincount(log.item, weights=log.weight, minlength=log.n_items)
    counts = np.bincount(log.item, minlength=log.n_items)
    shrunk = (sums + WEIGHT_PRIOR * float(log.weight.mean())) / (counts + WEIGHT_PRIOR)
    scaled: FloatArray = (shrunk - low) / (high - low)
    return scaled


def _category_share(log: InteractionLog) -> FloatArray:
    items = log.items
    n_categories = len(items.category_names)
    total = int(log.positive.sum())
    if n_categories == 0 or total == 0:
        return np.zeros(log.n_items)
    # A positive on an item in two categories counts once in each.
    per_item = _positives_per(log.item, log, log.n_items)
    owners = _item_of_category_entry(items)
    in_category = np.bincount(
        items.category_codes, weights=per_item[owners], minlength=n_categories
    )
    share = in_category / total
    best = np.zeros(log.n_items)
    np.maximum.at(best, owners, share[items.category_codes])
    return best


# Users


def _activity(log: InteractionLog) -> FloatArray:
    return _log_scaled(_positives_per(log.user, log, log.n_users))


def _tenure(log: InteractionLog) -> FloatArray:
    if len(log.time) == 0:
        return np.zeros(log.n_users)
    span = float(log.time.max() - log.time.min())
    first = _first_time(log.user, log.time, log.n_users, 0)
    last = _last_time(log.user, log.time, log.n_users, 0)
    if span <= 0:
        return np.zeros(log.n_users)
    tenure: FloatArray = (last - first).astype(np.float64) / span
    return tenure


def _category_breadth(log: InteractionLog) -> FloatArray:
    items = log.items
    n_categories = len(items.category_names)
    if n_categories == 0:
        return np.zeros(log.n_users)
    users, item_of = log.user[log.positive], log.item[log.positive]
    per_row = np.diff(items.category_offsets)[item_of]
    starts = np.repeat(items.category_offsets[:-1][item_of], per_row)
    within = np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    pairs = np.repeat(users, per_row) * n_categories + items.category_codes[starts + within]
    distinct = np.bincount(np.unique(pairs) // n_categories, minlength=log.n_users)
    breadth: FloatArray = distinct / n_categories
    return breadth


def _recency(log: InteractionLog) -> FloatArray:
    now = _last_timestamp(log)
    last = _last_time(log.user, log.time, log.n_users, now)
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
    log: InteractionLog, names: tuple[str, ...], registry: Mapping[str, Derivation], rows: int
) -> npt.NDArray[np.float32]:
    if not names:
        return np.zeros((rows, 0), dtype=np.float32)
    return np.stack([registry[name].compute(log) for name in names], axis=1).astype(np.float32)


def item_dense(log: InteractionLog, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    check_derivable(schema)
    return _dense(log, schema.item_dense, ITEM_FEATURES, log.n_items)


def user_dense(log: InteractionLog, schema: FeatureSchema) -> npt.NDArray[np.float32]:
    check_derivable(schema)
    return _dense(log, schema.user_dense, USER_FEATURES, log.n_users)
