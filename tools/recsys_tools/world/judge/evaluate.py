"""Offline evaluation on a per-user time holdout, with the service's own cascade.

Each user's latest share of positives (by time) is held out; everything is learnt from the
rest. The service's pool is rebuilt for each user as it would serve them (the nearest items
to their vector, the neighbours of their latest positives, popular items; minus what they
have seen), then each stage of the cascade is scored on the list it would serve:

- `recall`: the nearest items alone, in the index's order;
- `prerank`: the pool in the pre-rank score's order (app.pipeline.signals), and what it keeps;
- `rank`: what pre-rank kept, ranked by the ONNX model on rows packed as the service packs
  them: the answer (`recall_rank` in `methods`, its name before the cascade).

Beside them two baselines computed on the same split: `popularity`, and `item_knn`, the
items closest (by co-occurrence neighbours) to everything the user liked. Each stage also
reports `pool_share`, the share of held-out items still in what it hands on.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from app.clients.onnx_scorer import OnnxScorer, onnx_scorer
from app.core.cascade import CANDIDATE_COUNT, INDEX_NPROBE, POPULAR_CANDIDATES, PRERANK_KEEP
from app.core.settings import Settings
from app.pipeline.packing import encode_context, pack_rows
from app.pipeline.selectors.rerank import rerank
from app.pipeline.signals import best, prerank_scores, prerank_signals, sequence_columns
from app.release.catalog import set_search_breadth
from app.release.rules import NEUTRAL_RULES
from app.world.neighbours import Nearby, Neighbours
from app.world.order import NO_TASTE, OrderModel, Taste, taste_of
from app.world.prerank import PrerankWeights
from app.world.schema import FeatureSchema
from recsys_tools.world.judge.holdout import HoldoutSplit
from recsys_tools.world.judge.measures import bootstrap_interval
from recsys_tools.world.judge.served_view import (
    DECAY,
    SIMILAR,
    Recent,
    latest_positives,
    nearby,
)
from recsys_tools.world.judge.service_stages import ServiceStages
from recsys_tools.world.read.log import InteractionLog
from recsys_tools.world.read.tables import BoolArray, IntArray
from recsys_tools.world.read.times import utc_hour_weekday
from recsys_tools.world.store.index import build_index

FloatArray = npt.NDArray[np.float32]
K = 10
CANDIDATES: int = CANDIDATE_COUNT
POPULAR_CANDIDATES: int = POPULAR_CANDIDATES
KEEP: int = PRERANK_KEEP
NPROBE: int = INDEX_NPROBE
# Enough users for figures to two decimals; a large log stays quick.
MAX_USERS = 2000
# Users ranked per onnxruntime call: one call over many rows beats many small ones.
RANK_BATCH = 32
METHODS = ("recall", "prerank", "recall_rank", "popularity", "item_knn")
STAGES = {"recall": "recall", "prerank": "prerank", "rank": "recall_rank"}


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the service would hold: Redis blobs, item popularity and the ranking model."""

    user_blobs: FloatArray
    item_blobs: FloatArray
    popularity: FloatArray
    onnx_model: bytes
    neighbours: Neighbours | None = None
    prerank: PrerankWeights = field(default_factory=PrerankWeights)
    categories: IntArray | None = None  # each item's category code, as the catalog holds it
    order: OrderModel | None = None  # the order model (app.world.order), where the world has one


def _ragged(owner: IntArray, size: int) -> IntArray:
    """Offsets for values grouped by owner (already sorted by owner)."""
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=size))]).astype(np.int64)


def _seen_lists(log: InteractionLog) -> tuple[IntArray, IntArray]:
    """Each user's distinct items, rated high or low, as the service filters them."""
    keys = np.unique(log.user * log.n_items + log.item)
    owner = keys // log.n_items
    return _ragged(owner, log.n_users), keys % log.n_items


def _dcg(hits: BoolArray) -> float:
    return float((hits / np.log2(np.arange(2, len(hits) + 2))).sum())


def _scores(top: IntArray, relevant: IntArray) -> tuple[float, float]:
    """recall@K over min(K, |relevant|) and binary NDCG@K."""
    hits = np.isin(top[:K], relevant)
    ideal = min(K, len(relevant))
    return float(hits.sum()) / ideal, _dcg(hits) / _dcg(np.ones(ideal, dtype=bool))


def _unseen(ranked: IntArray, seen: IntArray, count: int) -> IntArray:
    kept: IntArray = ranked[(ranked >= 0) & ~np.isin(ranked, seen)]
    return kept[:count]


def _ranker(model: ServedModel) -> OnnxScorer:
    """The exported model through onnxruntime, as the in-process fallback ranker runs it."""
    return onnx_scorer(model.onnx_model, threads=2)


@dataclass(frozen=True, slots=True)
class JudgedUser:
    """One user the evaluation asks for: their row, what they had seen, what they went on
    to like, their context and their latest positives, as the service would read them."""

    user: int
    seen: IntArray
    relevant: IntArray
    context: FloatArray
    recent: IntArray  # the latest positives, oldest first, as the service reads them
    near: Nearby  # the items near those, as the service's features stage finds them
    liked: IntArray  # every positive before the holdout, for the item-to-item baseline
    taste: Taste = NO_TASTE  # what the order model makes of `recent`, as the service finds it


@dataclass(frozen=True, slots=True)
class Cascade:
    """One user's lists, stage by stage: the pool each stage hands on and its best K."""

    recall: IntArray
    pool: IntArray
    kept: IntArray  # pre-rank's choice, best first
    ranked: IntArray


class Evaluator:
    """The service's cascade over a world's arrays: `index`, the world's own (else one is
    built with `index_factory`, as the build does for the part it evaluates)."""

    def __init__(
        self,
        model: ServedModel,
        schema: FeatureSchema,
        index_factory: str,
        index: Any = None,
        settings: Settings | None = None,
    ) -> None:
        self.model = model
        self.schema = schema
        embeddings = np.ascontiguousarray(model.item_blobs[:, : schema.embedding_dim])
        self.vectors = embeddings.astype(np.float32)  # as the service holds them
        self.index = build_index(embeddings, index_factory) if index is None else index
        set_search_breadth(self.index, NPROBE)
        self.popular = np.argsort(-model.popularity, kind="stable").astype(np.int64)
        self.ranker = _ranker(model)
        self.categories = (
            np.zeros(len(self.popular), dtype=np.int64)
            if model.categories is None
            else model.categories
        )
        self.stages = ServiceStages(
            schema,
            self.index,
            self.vectors,
            self.popular,
            self.categories,
            model.neighbours,
            model.prerank,
            settings,
        )

    def ranked_by(self, onnx_model: bytes) -> Evaluator:
        """The same cascade with another model ranking; the index and stages shared."""
        other = copy.copy(self)
        other.model = replace(self.model, onnx_model=onnx_model)
        other.ranker = _ranker(other.model)
        return other

    def search(self, queries: list[JudgedUser]) -> IntArray:
        n_items = len(self.popular)
        deepest = max(len(q.seen) for q in queries) + K
        k = min(n_items, max(CANDIDATES, deepest))
        dim = self.schema.embedding_dim
        vectors = np.stack([self.model.user_blobs[q.user, :dim] for q in queries])
        _, found = self.index.search(np.ascontiguousarray(vectors), k)
        ids: IntArray = found.astype(np.int64)
        return ids

    def pools(self, found: IntArray, q: JudgedUser) -> tuple[IntArray, IntArray]:
        """The service's pool for `q` after the filters, and what its pre-rank hands the
        model: the service's own stage objects, over this world (service_stages.py)."""
        blob = self.model.user_blobs[q.user]
        return self.stages.pools(found, blob, q.seen, q.recent, q.near, q.taste)

    def signals(self, q: JudgedUser, positions: IntArray) -> FloatArray:
        """What relates each of `positions` to the user's latest items (app.pipeline.signals)."""
        return prerank_signals(
            positions,
            self.model.user_blobs[q.user, : self.schema.embedding_dim],
            q.recent,
            self.vectors,
            q.near,
            DECAY,
            self.model.categories,
            taste=q.taste,
        )

    def prerank_order(self, q: JudgedUser, pool: IntArray) -> npt.NDArray[np.intp]:
        """The pool's whole pre-rank order: its first KEEP are what the stage hands on, and
        its first K what it would serve were the model down."""
        order = best(prerank_scores(self.signals(q, pool), self.model.prerank), len(pool))
        return order

    def packed(self, q: JudgedUser, pool: IntArray, signals: FloatArray) -> FloatArray:
        """The model's input for `pool` (what pre-rank kept), packed as the service packs it."""
        schema = self.schema
        return pack_rows(
            schema,
            self.model.user_blobs[q.user],
            self.model.item_blobs[pool],
            q.context,
            sequence=sequence_columns(schema, signals) if schema.sequence else None,
        )

    def kept(self, q: JudgedUser, found: IntArray) -> tuple[IntArray, FloatArray]:
        """What pre-rank hands the model for `q` (the positions, and their signals), from
        what the index found for it."""
        _, handed = self.pools(found, q)
        return handed, self.signals(q, handed)

    def rank(
        self, queries: list[JudgedUser], pools: list[IntArray], signals: list[FloatArray]
    ) -> list[IntArray]:
        rows = np.concatenate(
            [
                self.packed(q, pool, sequence)
                for q, pool, sequence in zip(queries, pools, signals, strict=True)
            ]
        )
        scores = self.ranker.score(rows)
        ends = np.cumsum([len(pool) for pool in pools])
        return [
            self.reranked(pool, part)
            for pool, part in zip(pools, np.split(scores, ends[:-1]), strict=True)
        ]

    def reranked(self, pool: IntArray, scores: npt.NDArray[np.float32]) -> IntArray:
        """The first K of `pool` by the service's own rerank under rules that change nothing
        (no boost, cap, diversity or exploration): the model's order, equal scores in catalog
        order as the service breaks them (not pre-rank's order, which a plain argsort kept)."""
        selection = rerank(
            tie_keys=pool,
            scores=scores,
            categories=self.categories[pool],
            age_days=np.zeros(len(pool), dtype=np.float32),
            rules=NEUTRAL_RULES,
            n_items=K,
            scale=self.schema.score_scale,
        )
        kept: IntArray = pool[selection.positions]
        return kept

    def cascades(self, queries: list[JudgedUser]) -> list[Cascade]:
        found = self.search(queries)
        pools = [self.pools(row, q) for row, q in zip(found, queries, strict=True)]
        orders = [self.prerank_order(q, pool) for q, (pool, _) in zip(queries, pools, strict=True)]
        ranked = self.rank(
            queries,
            [handed for _, handed in pools],
            [self.signals(q, handed) for q, (_, handed) in zip(queries, pools, strict=True)],
        )
        return [
            Cascade(_unseen(row, q.seen, K), pool, pool[order[:KEEP]], top)
            for row, q, (pool, _), order, top in zip(
                found, queries, pools, orders, ranked, strict=True
            )
        ]

    def item_knn(self, q: JudgedUser) -> IntArray:
        """The item-to-item baseline: neighbours of everything the user liked, summed."""
        if self.model.neighbours is None or not len(q.liked):
            return self.popular[:0]
        top: IntArray = _unseen(self.model.neighbours.around(q.liked, 1.0).items, q.seen, K)
        if len(top) < K:  # too few neighbours: popular items make up the list
            spare = self.popular[~np.isin(self.popular, top) & ~np.isin(self.popular, q.seen)]
            top = np.concatenate([top, spare[: K - len(top)]])
        return top


def _liked_lists(train: InteractionLog) -> Recent:
    """Every positive of each user before their holdout, oldest first, repeats kept."""
    return latest_positives(train, count=np.iinfo(np.int32).max)


def _queries(
    holdout: HoldoutSplit,
    train: InteractionLog,
    schema: FeatureSchema,
    model: ServedModel,
    seed: int,
) -> Iterator[list[JudgedUser]]:
    """The evaluated users (a seeded sample of MAX_USERS at most), in batches."""
    chosen = np.arange(len(holdout.users))
    if len(chosen) > MAX_USERS:
        chosen = np.sort(np.random.default_rng(seed).choice(chosen, MAX_USERS, replace=False))
    seen_offsets, seen_items = _seen_lists(train)
    recent, liked = latest_positives(train), _liked_lists(train)
    # A request carries some context; the ranker learnt device, page and locale say nothing
    # here, and the hour and weekday are those of the moment the holdout begins.
    device, page, locale = schema.devices[0], schema.pages[0], schema.locales[0]
    hours, weekdays = utc_hour_weekday(holdout.moments)
    batch: list[JudgedUser] = []
    for k in chosen.tolist():
        user = int(holdout.users[k])
        hour, weekday = int(hours[k]), int(weekdays[k])
        latest = recent.of(user)
        batch.append(
            JudgedUser(
                user=user,
                seen=seen_items[seen_offsets[user] : seen_offsets[user + 1]],
                relevant=holdout.items[holdout.offsets[k] : holdout.offsets[k + 1]],
                context=encode_context(schema, device, page, locale, hour, weekday),
                recent=latest,
                near=nearby(model.neighbours, latest),
                liked=liked.of(user),
                taste=taste_of(model.order, latest),
            )
        )
        if len(batch) == RANK_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _share(pool: IntArray, relevant: IntArray) -> float:
    return float(np.isin(relevant, pool).mean()) if len(relevant) else 0.0


def evaluate(
    train: InteractionLog,
    holdout: HoldoutSplit,
    model: ServedModel,
    schema: FeatureSchema,
    index_factory: str = "auto",
    seed: int = 7,
) -> dict[str, Any]:
    """recall@10 and NDCG@10 of each stage and baseline, and what share of the held-out
    items each stage still holds, averaged over (a sample of) held-out users."""
    evaluator = Evaluator(model, schema, index_factory)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    shares: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for queries in _queries(holdout, train, schema, model, seed):
        for q, cascade in zip(queries, evaluator.cascades(queries), strict=True):
            figures["recall"].append(_scores(cascade.recall, q.relevant))
            figures["prerank"].append(_scores(cascade.kept[:K], q.relevant))
            figures["recall_rank"].append(_scores(cascade.ranked, q.relevant))
            popular = _unseen(evaluator.popular[: K + len(q.seen)], q.seen, K)
            figures["popularity"].append(_scores(popular, q.relevant))
            figures["item_knn"].append(_scores(evaluator.item_knn(q), q.relevant))
            shares["recall"].append(_share(cascade.pool, q.relevant))
            shares["prerank"].append(_share(cascade.kept, q.relevant))
            shares["rank"].append(_share(cascade.ranked, q.relevant))
    evaluated = len(figures["recall"])
    methods = {
        name: {
            f"recall@{K}": _mean([r for r, _ in values]),
            # Drawn from the build's seed, the one that samples the users judged.
            f"recall@{K}_interval": bootstrap_interval([r for r, _ in values], seed),
            f"ndcg@{K}": _mean([n for _, n in values]),
        }
        for name, values in figures.items()
    }
    return {
        "k": K,
        "holdout_share": holdout.share,
        "users_with_holdout": len(holdout.users),
        "users_evaluated": evaluated,
        "holdout_items": len(holdout.items),
        "candidates": {
            "recalled": CANDIDATES,
            "similar": SIMILAR if model.neighbours is not None else 0,
            "popular": POPULAR_CANDIDATES,
            "prerank_keep": KEEP,
        },
        "stages": {
            stage: {"pool_share": _mean(shares[stage]), **methods[method]}
            for stage, method in STAGES.items()
        },
        "methods": methods,
    }


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None
