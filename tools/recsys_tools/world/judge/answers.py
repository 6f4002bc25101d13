"""What a world would answer, computed from its files alone, as the build's evaluation does.

The service reads a user's vector, seen list and latest positives from Redis, which
`load-redis` wrote from the world's users.npz, seen.npz and positives.npz; here they are read
from those files, and the cascade is the evaluation's (evaluate.Evaluator) over the world's
own index, neighbours, pre-rank weights and model. With rules that change nothing, the
service must answer the same list: `recsys evaluate` compares the two item for item.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.core.cascade import RECENT_ITEMS
from app.core.errors import ConfigError
from app.core.settings import Settings
from app.pipeline.packing import encode_context
from app.release.catalog import read_index
from app.world.layout import DEFAULT_USER_FILE, INDEX_FILE, MODEL_FILE, SCHEMA_FILE
from app.world.neighbours import load_neighbours
from app.world.order import load_order, taste_of
from app.world.prerank import load_prerank
from app.world.schema import FeatureSchema, load_schema
from app.world.tables import load_items, load_positives, load_seen, load_users
from recsys_tools.world.judge.evaluate import RANK_BATCH, Evaluator, JudgedUser, ServedModel
from recsys_tools.world.judge.served_view import nearby

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]
RECENT: int = RECENT_ITEMS


@dataclass(frozen=True, slots=True)
class AskContext:
    """The request's context, as the API's `context` object gives it."""

    device: str = "other"
    page: str = "other"
    locale: str = "other"
    hour: int = 12
    weekday: int = 2

    def as_json(self) -> dict[str, str | int]:
        return {
            "device": self.device,
            "page": self.page,
            "locale": self.locale,
            "hour": self.hour,
            "weekday": self.weekday,
        }


@dataclass(frozen=True, slots=True)
class _Lists:
    """Per-user item lists from a world file, as catalog positions, by user id."""

    starts: dict[str, tuple[int, int]]
    positions: IntArray

    def of(self, user: str) -> IntArray:
        start, end = self.starts.get(user, (0, 0))
        return self.positions[start:end]


def _lists(user_ids: npt.NDArray[np.str_], offsets: IntArray, items: IntArray) -> _Lists:
    starts = {str(user): (int(offsets[k]), int(offsets[k + 1])) for k, user in enumerate(user_ids)}
    return _Lists(starts, items)


class WorldAnswers:
    """The world's files, read once; `answers` for any users. `settings`: those of the
    service compared with (its candidate stages'), else the defaults."""

    def __init__(self, world: Path, settings: Settings | None = None) -> None:
        if not (world / MODEL_FILE).is_file():
            raise ConfigError(f"{world} has no {MODEL_FILE}: a world built from a log has one")
        self.schema: FeatureSchema = load_schema(world / SCHEMA_FILE)
        items, users = load_items(world), load_users(world)
        self.item_ids = items.ids.astype(np.str_)
        self._user_row = {str(user): k for k, user in enumerate(users.ids.tolist())}
        by_id = np.argsort(self.item_ids)

        def positions(ids: npt.NDArray[np.str_]) -> IntArray:
            """Catalog positions of `ids`, -1 for an id the catalog lacks."""
            at = np.minimum(np.searchsorted(self.item_ids, ids, sorter=by_id), len(by_id) - 1)
            found = by_id[at]
            known = self.item_ids[found] == ids
            return np.where(known, found, -1).astype(np.int64)

        seen, positives = load_seen(world), load_positives(world)
        empty = _Lists({}, np.empty(0, dtype=np.int64))
        self._seen = (
            empty if seen is None else _lists(seen.user_ids, seen.offsets, positions(seen.item_ids))
        )
        self._positives = (
            empty
            if positives is None
            else _lists(positives.user_ids, positives.offsets, positions(positives.item_ids))
        )
        self._positions = positions
        self._default = np.load(world / DEFAULT_USER_FILE).astype(np.float32)
        user_blobs = np.concatenate([users.embeddings, users.dense], axis=1).astype(np.float32)
        # The last row is the default user: a cold start's blob.
        self._user_blobs = np.concatenate([user_blobs, self._default[None, :]])
        model = ServedModel(
            self._user_blobs,
            np.concatenate([items.embeddings, items.dense], axis=1).astype(np.float32),
            items.popularity.astype(np.float32),
            (world / MODEL_FILE).read_bytes(),
            load_neighbours(world, len(self.item_ids)),
            load_prerank(world),
            items.categories.astype(np.int64),
            load_order(world, len(self.item_ids), "order" in self.schema.sequence),
        )
        index = read_index(world / INDEX_FILE, mmap=False)
        self._evaluator = Evaluator(model, self.schema, "auto", index, settings)

    def _judged(self, user: str, context: AskContext) -> JudgedUser:
        recent = self._positives.of(user)[-RECENT:]
        recent = recent[recent >= 0]
        seen = self._seen.of(user)
        return JudgedUser(
            user=self._user_row.get(user, len(self._user_blobs) - 1),
            seen=seen[seen >= 0],
            relevant=np.empty(0, dtype=np.int64),
            context=encode_context(
                self.schema,
                context.device,
                context.page,
                context.locale,
                context.hour,
                context.weekday,
            ),
            recent=recent,
            near=nearby(self._evaluator.model.neighbours, recent),
            liked=recent,
            taste=taste_of(self._evaluator.model.order, recent),
        )

    def model_input(self, user: str, context: AskContext) -> tuple[list[str], FloatArray]:
        """The items pre-rank keeps for `user` and the rows the model scores for them."""
        query = self._judged(user, context)
        (found,) = self._evaluator.search([query])
        kept, signals = self._evaluator.kept(query, found)
        return self.item_ids[kept].tolist(), self._evaluator.packed(query, kept, signals)

    def rows_for(
        self, user: str, items: Sequence[str] | npt.NDArray[np.str_], context: AskContext
    ) -> tuple[npt.NDArray[np.bool_], FloatArray]:
        """The rows the model would score for `items` shown to `user`, packed as the service
        packs them: which of the items the catalog holds, and their rows."""
        positions = self._positions(np.asarray(items, dtype=np.str_))
        known = positions >= 0
        query = self._judged(user, context)
        kept = positions[known]
        return known, self._evaluator.packed(query, kept, self._evaluator.signals(query, kept))

    def ranked_by(self, onnx_model: bytes) -> WorldAnswers:
        """The same world's answers with another model (ONNX bytes of its schema) ranking:
        its files, index and lists read once, shared."""
        other = copy.copy(self)
        other._evaluator = self._evaluator.ranked_by(onnx_model)
        return other

    def score(self, rows: FloatArray) -> npt.NDArray[np.float32]:
        """The ranker's score for packed rows."""
        return self._evaluator.ranker.score(rows)

    def candidates(self, user: str, context: AskContext) -> tuple[list[str], list[str]]:
        """The pool pre-rank cuts for `user` (after the filters, in recall's order) and what it
        keeps, in the model's order (best first), as item ids."""
        query = self._judged(user, context)
        (found,) = self._evaluator.search([query])
        pool, _ = self._evaluator.pools(found, query)
        kept, signals = self._evaluator.kept(query, found)
        scores = self._evaluator.ranker.score(self._evaluator.packed(query, kept, signals))
        by_model = kept[np.lexsort((kept, -scores))]  # ties by catalog position, as rerank
        return self.item_ids[pool].tolist(), self.item_ids[by_model].tolist()

    def answers(self, users: Sequence[str], context: AskContext) -> Iterator[tuple[str, list[str]]]:
        """Each user's answer of ten, item ids best first, in batches of RANK_BATCH."""
        for start in range(0, len(users), RANK_BATCH):
            batch = list(users[start : start + RANK_BATCH])
            cascades = self._evaluator.cascades([self._judged(user, context) for user in batch])
            for user, cascade in zip(batch, cascades, strict=True):
                yield user, self.item_ids[cascade.ranked].tolist()
