"""A synthetic world with structure, so a trained ranker beats random and popularity.

Items belong to categories whose centroids live in the embedding space, with power-law
popularity, prices per category, a hidden quality and publish dates. Users fall into taste
clusters that each like a few categories. Clicks follow a hidden logistic model of taste
similarity, quality, popularity, freshness, price fit and context.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.pipeline.packing import encode_context
from app.world.schema import FeatureSchema
from app.world.tables import ItemTable, SeenLists, UserTable

DAY = 86_400
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Interactions:
    """Impressions with their click labels and the context each was shown in; `liked`,
    among the clicks, the ones the user went on to like."""

    users: IntArray
    items: IntArray
    contexts: FloatArray
    clicked: npt.NDArray[np.int8]
    liked: npt.NDArray[np.int8]


@dataclass(frozen=True, slots=True)
class World:
    items: ItemTable
    users: UserTable
    interactions: Interactions
    seen: SeenLists


def _unit(rows: FloatArray) -> FloatArray:
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    unit: FloatArray = (rows / np.maximum(norms, 1e-6)).astype(np.float32)
    return unit


def _items(
    rng: np.random.Generator, n_items: int, schema: FeatureSchema, now: int
) -> tuple[ItemTable, FloatArray, FloatArray, FloatArray]:
    dim = schema.embedding_dim
    n_categories = int(np.clip(n_items // 50, 4, 64))
    centroids = _unit(rng.standard_normal((n_categories, dim)).astype(np.float32))
    category_weight = 1.0 / np.arange(1, n_categories + 1) ** 0.8
    categories = rng.choice(n_categories, size=n_items, p=category_weight / category_weight.sum())
    noise = rng.standard_normal((n_items, dim)).astype(np.float32) * (0.9 / np.sqrt(dim))
    embeddings = _unit(centroids[categories] + noise)
    popularity = (1.0 / rng.permutation(np.arange(1, n_items + 1)) ** 0.9).astype(np.float32)
    age_days = rng.exponential(90.0, size=n_items).clip(0, 730)
    published_at = (now - age_days * DAY).astype(np.int64)
    category_price = rng.uniform(0.5, 3.0, size=n_categories)
    price = (category_price[categories] * rng.lognormal(0, 0.4, size=n_items)).astype(np.float32)
    quality = rng.beta(2.0, 2.0, size=n_items).astype(np.float32)
    log_pop = np.log1p(popularity * n_items) / np.log1p(n_items)
    dense_values = {
        "log_popularity": log_pop,
        "freshness": np.exp(-age_days / 30.0),
        "price": np.log(price),
        "quality": np.clip(quality + rng.normal(0, 0.15, size=n_items), 0, 1),
    }
    dense = np.stack([dense_values[name] for name in schema.item_dense], axis=1)
    table = ItemTable(
        ids=np.array([f"i{i}" for i in range(n_items)]),
        embeddings=embeddings,
        dense=dense.astype(np.float32),
        categories=categories.astype(np.int64),
        published_at=published_at,
        popularity=popularity,
    )
    return table, centroids, quality, price


def _users(
    rng: np.random.Generator, n_users: int, centroids: FloatArray, schema: FeatureSchema
) -> tuple[UserTable, FloatArray]:
    n_categories, dim = centroids.shape
    n_clusters = int(np.clip(n_users // 100, 2, 32))
    liked = rng.choice(n_categories, size=(n_clusters, 3))
    cluster_taste = _unit(centroids[liked].sum(axis=1))
    cluster = rng.integers(0, n_clusters, size=n_users)
    noise = rng.standard_normal((n_users, dim)).astype(np.float32) * (0.6 / np.sqrt(dim))
    embeddings = _unit(cluster_taste[cluster] + noise)
    price_affinity = rng.uniform(0.5, 3.0, size=n_clusters)[cluster] * rng.lognormal(
        0, 0.2, size=n_users
    )
    dense_values = {
        "activity": rng.lognormal(0, 0.5, size=n_users),
        "tenure": rng.uniform(0, 1, size=n_users),
        "price_affinity": np.log(price_affinity),
        "category_breadth": rng.uniform(0.2, 1.0, size=n_users),
    }
    dense = np.stack([dense_values[name] for name in schema.user_dense], axis=1)
    table = UserTable(
        ids=np.array([f"u{u}" for u in range(n_users)]),
        embeddings=embeddings,
        dense=dense.astype(np.float32),
    )
    return table, price_affinity.astype(np.float32)


def _contexts(
    rng: np.random.Generator, n: int, schema: FeatureSchema
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    devices = rng.choice(schema.devices, size=n, p=_weights(len(schema.devices)))
    pages = rng.choice(schema.pages, size=n)
    locales = rng.choice(schema.locales, size=n)
    hours = rng.integers(0, 24, size=n)
    weekdays = rng.integers(0, 7, size=n)
    rows = np.stack(
        [
            encode_context(schema, str(d), str(p), str(loc), int(h), int(w))
            for d, p, loc, h, w in zip(devices, pages, locales, hours, weekdays, strict=True)
        ]
    )
    return rows, devices == "mobile"


def _weights(n: int) -> npt.NDArray[np.float64]:
    raw: npt.NDArray[np.float64] = np.linspace(2.0, 1.0, n)
    normalised: npt.NDArray[np.float64] = raw / raw.sum()
    return normalised


def like_logit(taste: FloatArray, quality: FloatArray, log_price: FloatArray) -> FloatArray:
    """Whether a click turns into a like: taste and quality count, popularity and the
    device do not, and a dear item has to be better to be liked (a second objective that
    is not the first one again)."""
    logit = 6.0 * taste + 2.5 * quality - 0.5 * log_price - 2.0
    as_float32: FloatArray = logit.astype(np.float32)
    return as_float32


def click_logit(
    taste: FloatArray,
    quality: FloatArray,
    log_pop: FloatArray,
    freshness: FloatArray,
    price_gap: FloatArray,
    on_mobile: npt.NDArray[np.bool_],
    log_price: FloatArray,
) -> FloatArray:
    """The hidden truth the ranker has to learn; non-linear in price fit and device."""
    logit = (
        5.0 * taste
        + 1.5 * quality
        + 0.8 * log_pop
        + 0.7 * freshness
        - 1.2 * np.abs(price_gap)
        - 0.6 * on_mobile * log_price
        - 3.0
    )
    as_float32: FloatArray = logit.astype(np.float32)
    return as_float32


def _impressions(
    rng: np.random.Generator,
    items: ItemTable,
    users: UserTable,
    quality: FloatArray,
    price: FloatArray,
    price_affinity: FloatArray,
    n_impressions: int,
    schema: FeatureSchema,
) -> Interactions:
    user_idx = rng.integers(0, len(users.ids), size=n_impressions)
    # Half of what users are shown is popular, half is anything: like a real feed's mix.
    by_popularity = items.popularity / items.popularity.sum()
    popular = rng.choice(len(items.ids), size=n_impressions, p=by_popularity)
    anything = rng.integers(0, len(items.ids), size=n_impressions)
    item_idx = np.where(rng.random(n_impressions) < 0.5, popular, anything)
    contexts, on_mobile = _contexts(rng, n_impressions, schema)
    dense = dict(zip(schema.item_dense, items.dense[item_idx].T, strict=True))
    taste = np.einsum("ij,ij->i", users.embeddings[user_idx], items.embeddings[item_idx])
    logit = click_logit(
        taste,
        quality[item_idx],
        dense["log_popularity"],
        dense["freshness"],
        np.log(price[item_idx]) - np.log(price_affinity[user_idx]),
        on_mobile,
        np.log(price[item_idx]),
    )
    clicked = (rng.random(n_impressions) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    liking = like_logit(taste, quality[item_idx], np.log(price[item_idx]))
    liked = clicked * (rng.random(n_impressions) < 1.0 / (1.0 + np.exp(-liking)))
    return Interactions(
        user_idx, item_idx.astype(np.int64), contexts, clicked, liked.astype(np.int8)
    )


def _seen_lists(users: UserTable, items: ItemTable, interactions: Interactions) -> SeenLists:
    """Clicked items become each user's recently seen list."""
    clicks = interactions.clicked == 1
    user_of_click, item_of_click = interactions.users[clicks], interactions.items[clicks]
    order = np.argsort(user_of_click, kind="stable")
    counts = np.bincount(user_of_click, minlength=len(users.ids))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return SeenLists(users.ids, offsets, items.ids[item_of_click[order]])


def generate_world(
    schema: FeatureSchema, n_items: int, n_users: int, n_impressions: int, seed: int = 7
) -> World:
    rng = np.random.default_rng(seed)
    now = int(time.time())
    items, centroids, quality, price = _items(rng, n_items, schema, now)
    users, price_affinity = _users(rng, n_users, centroids, schema)
    interactions = _impressions(
        rng, items, users, quality, price, price_affinity, n_impressions, schema
    )
    seen = _seen_lists(users, items, interactions)
    return World(items, users, interactions, seen)
