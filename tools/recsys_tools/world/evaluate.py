"""Offline evaluation on a per-user time holdout, with the service's own candidate path.

Each user's latest share of positives (by time) is held out; everything is learned from the
rest. Three methods then pick 10 unseen items per user: `recall` (the FAISS index alone),
`recall_rank` (what the service does: recalled plus popular candidates, ranked by the ONNX
model on rows packed as the service packs them) and `popularity`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.settings import Settings
from app.pipeline.packing import encode_context, pack_rows
from app.pipeline.sources.popular import merge_popular
from app.release.catalog import set_search_breadth
from app.release.schema import FeatureSchema
from recsys_tools.world.index import build_index
from recsys_tools.world.logs import BoolArray, IntArray, InteractionLog
from recsys_tools.world.train import utc_hour_weekday

FloatArray = npt.NDArray[np.float32]
K = 10
CANDIDATES: int = Settings.model_fields["candidate_count"].default
POPULAR_CANDIDATES: int = Settings.model_fields["popular_candidates"].default
NPROBE: int = Settings.model_fields["index_nprobe"].default
# Enough users for figures to two decimals; a large log stays quick.
MAX_USERS = 2000
# Users ranked per onnxruntime call: one call over many rows beats many small ones.
RANK_BATCH = 32
METHODS = ("recall", "recall_rank", "popularity")


@dataclass(frozen=True, slots=True)
class Holdout:
    """Which log rows are for training, and each evaluated user's held-out items.

    User users[k]'s held-out items are items[offsets[k]:offsets[k + 1]]: distinct, none of
    them a training positive of theirs (the service would filter those as seen). moments[k]
    is when their holdout begins.
    """

    train: BoolArray
    users: IntArray
    offsets: IntArray
    items: IntArray
    moments: IntArray
    share: float


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What the service would hold: Redis blobs, item popularity and the ranking model."""

    user_blobs: FloatArray
    item_blobs: FloatArray
    popularity: FloatArray
    onnx_model: bytes


def _ragged(owner: IntArray, size: int) -> IntArray:
    """Offsets for values grouped by owner (already sorted by owner)."""
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=size))]).astype(np.int64)


def split_holdout(log: InteractionLog, share: float) -> Holdout:
    """The last ceil(share) of each user's positives by time (at least 1, users with 2 or more).

    A user's other rows after their holdout begins are held out too: training only sees
    what happened before the moment being predicted.
    """
    rows = np.flatnonzero(log.positive)  # by user, then time
    users = log.user[rows]
    count = np.bincount(users, minlength=log.n_users)
    # The epsilon keeps 0.2 * 5 (1.0000000000000002 in floating point) at 1, not 2.
    wanted = np.clip(np.ceil(share * count - 1e-9), 1, np.maximum(count - 1, 1))
    held = np.where(count >= 2, wanted, 0).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    rank = np.arange(len(rows)) - start[users]
    out = rank >= (count - held)[users]
    begins = np.full(log.n_users, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(begins, users[out], log.time[rows[out]])
    train = log.time < begins[log.user]
    train[rows] = ~out
    return _holdout_sets(log, train, rows[out], begins, share)


def _holdout_sets(
    log: InteractionLog, train: BoolArray, held_rows: IntArray, begins: IntArray, share: float
) -> Holdout:
    n_items = log.n_items
    seen = np.unique(log.user[train] * n_items + log.item[train])
    keys = np.unique(log.user[held_rows] * n_items + log.item[held_rows])
    keys = keys[~np.isin(keys, seen)]
    owner, items = keys // n_items, keys % n_items
    users = np.unique(owner)
    offsets = np.searchsorted(owner, users)
    return Holdout(
        train=train,
        users=users,
        offsets=np.append(offsets, len(keys)).astype(np.int64),
        items=items,
        moments=begins[users],
        share=share,
    )


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


class _Ranker:
    """The exported model through onnxruntime, as the in-process fallback ranker runs it."""

    def __init__(self, model: ServedModel, schema: FeatureSchema) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self._session = ort.InferenceSession(
            model.onnx_model, options, providers=["CPUExecutionProvider"]
        )
        self._input = schema.input_name

    def score(self, rows: FloatArray) -> npt.NDArray[np.float32]:
        (scores,) = self._session.run(None, {self._input: rows})
        flat: npt.NDArray[np.float32] = np.asarray(scores, dtype=np.float32).reshape(-1)
        return flat


@dataclass(frozen=True, slots=True)
class _Query:
    user: int
    seen: IntArray
    relevant: IntArray
    context: FloatArray


class _Evaluator:
    def __init__(self, model: ServedModel, schema: FeatureSchema, index_factory: str) -> None:
        self.model = model
        self.schema = schema
        embeddings = np.ascontiguousarray(model.item_blobs[:, : schema.embedding_dim])
        self.index = build_index(embeddings, index_factory)
        set_search_breadth(self.index, NPROBE)
        self.popular = np.argsort(-model.popularity, kind="stable").astype(np.int64)
        self.ranker = _Ranker(model, schema)

    def search(self, queries: list[_Query]) -> IntArray:
        n_items = len(self.popular)
        deepest = max(len(q.seen) for q in queries) + K
        k = min(n_items, max(CANDIDATES, deepest))
        dim = self.schema.embedding_dim
        vectors = np.stack([self.model.user_blobs[q.user, :dim] for q in queries])
        _, found = self.index.search(np.ascontiguousarray(vectors), k)
        ids: IntArray = found.astype(np.int64)
        return ids

    def candidates(self, found: IntArray, seen: IntArray) -> IntArray:
        """The service's candidate set: recalled, then popular ones, minus seen, backfilled."""
        k = min(CANDIDATES, len(self.popular))
        recalled = found[:k]
        recalled = recalled[recalled >= 0]
        extra = min(POPULAR_CANDIDATES + max(0, k - len(recalled)), len(self.popular))
        merged = merge_popular(recalled, self.popular, extra)
        kept = merged[~np.isin(merged, seen)]
        if len(kept) < K:
            spare = self.popular[~np.isin(self.popular, kept) & ~np.isin(self.popular, seen)]
            kept = np.concatenate([kept, spare[: K - len(kept)]])
        return kept

    def rank(self, queries: list[_Query], pools: list[IntArray]) -> list[IntArray]:
        rows = np.concatenate(
            [
                pack_rows(
                    self.schema,
                    self.model.user_blobs[q.user],
                    self.model.item_blobs[pool],
                    q.context,
                )
                for q, pool in zip(queries, pools, strict=True)
            ]
        )
        scores = self.ranker.score(rows)
        ends = np.cumsum([len(pool) for pool in pools])
        ranked = []
        for pool, part in zip(pools, np.split(scores, ends[:-1]), strict=True):
            ranked.append(pool[np.argsort(-part, kind="stable")[:K]])
        return ranked


def _queries(
    holdout: Holdout, train: InteractionLog, schema: FeatureSchema, seed: int
) -> Iterator[list[_Query]]:
    """The evaluated users (a seeded sample of MAX_USERS at most), in batches."""
    chosen = np.arange(len(holdout.users))
    if len(chosen) > MAX_USERS:
        chosen = np.sort(np.random.default_rng(seed).choice(chosen, MAX_USERS, replace=False))
    seen_offsets, seen_items = _seen_lists(train)
    # A request carries some context; the ranker learnt device, page and locale say nothing
    # here, and the hour and weekday are those of the moment the holdout begins.
    device, page, locale = schema.devices[0], schema.pages[0], schema.locales[0]
    hours, weekdays = utc_hour_weekday(holdout.moments)
    batch: list[_Query] = []
    for k in chosen.tolist():
        user = int(holdout.users[k])
        hour, weekday = int(hours[k]), int(weekdays[k])
        batch.append(
            _Query(
                user=user,
                seen=seen_items[seen_offsets[user] : seen_offsets[user + 1]],
                relevant=holdout.items[holdout.offsets[k] : holdout.offsets[k + 1]],
                context=encode_context(schema, device, page, locale, hour, weekday),
            )
        )
        if len(batch) == RANK_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def evaluate(
    train: InteractionLog,
    holdout: Holdout,
    model: ServedModel,
    schema: FeatureSchema,
    index_factory: str = "auto",
    seed: int = 7,
) -> dict[str, Any]:
    """recall@10 and NDCG@10 of each method, averaged over (a sample of) held-out users."""
    evaluator = _Evaluator(model, schema, index_factory)
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in METHODS}
    for queries in _queries(holdout, train, schema, seed):
        found = evaluator.search(queries)
        pools = [evaluator.candidates(row, q.seen) for row, q in zip(found, queries, strict=True)]
        ranked = evaluator.rank(queries, pools)
        for q, row, top in zip(queries, found, ranked, strict=True):
            figures["recall"].append(_scores(_unseen(row, q.seen, K), q.relevant))
            figures["recall_rank"].append(_scores(top, q.relevant))
            popular = _unseen(evaluator.popular[: K + len(q.seen)], q.seen, K)
            figures["popularity"].append(_scores(popular, q.relevant))
    evaluated = len(figures["recall"])
    return {
        "k": K,
        "holdout_share": holdout.share,
        "users_with_holdout": len(holdout.users),
        "users_evaluated": evaluated,
        "holdout_items": len(holdout.items),
        "candidates": {"recalled": CANDIDATES, "popular": POPULAR_CANDIDATES},
        "methods": {
            name: {
                f"recall@{K}": _mean([r for r, _ in values]),
                f"ndcg@{K}": _mean([n for _, n in values]),
            }
            for name, values in figures.items()
        },
    }


def _mean(values: list[float]) -> float | None:
    return round(float(np.mean(values)), 4) if values else None
