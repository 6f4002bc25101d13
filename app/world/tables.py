"""The world's tables as the builders write them (the format: docs/world-format.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.world.layout import (
    DEFAULT_USER_FILE,
    HOLDOUT_FILE,
    ITEMS_FILE,
    POSITIVES_FILE,
    SEEN_FILE,
    USERS_FILE,
)
from app.world.schema import FeatureSchema


@dataclass(frozen=True, slots=True)
class ItemTable:
    ids: npt.NDArray[np.str_]
    embeddings: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    categories: npt.NDArray[np.int64]
    published_at: npt.NDArray[np.int64]
    popularity: npt.NDArray[np.float32]

    def check(self, schema: FeatureSchema) -> None:
        n = len(self.ids)
        expected = {
            "embeddings": (n, schema.embedding_dim),
            "dense": (n, len(schema.item_dense)),
            "categories": (n,),
            "published_at": (n,),
            "popularity": (n,),
        }
        _check_shapes("items", self, expected)
        if len(np.unique(self.ids)) != n:
            raise ConfigError("item ids are not unique")


@dataclass(frozen=True, slots=True)
class UserTable:
    ids: npt.NDArray[np.str_]
    embeddings: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]

    def check(self, schema: FeatureSchema) -> None:
        n = len(self.ids)
        expected = {
            "embeddings": (n, schema.embedding_dim),
            "dense": (n, len(schema.user_dense)),
        }
        _check_shapes("users", self, expected)


@dataclass(frozen=True, slots=True)
class SeenLists:
    """Recently seen items per user, flattened.

    User i's list is item_ids[offsets[i] : offsets[i + 1]].
    """

    user_ids: npt.NDArray[np.str_]
    offsets: npt.NDArray[np.int64]
    item_ids: npt.NDArray[np.str_]


@dataclass(frozen=True, slots=True)
class PositiveLists:
    """Each user's positives, oldest first, an item as often as it was chosen; flattened
    like SeenLists. The ingest consumer folds a user's vector in from these."""

    user_ids: npt.NDArray[np.str_]
    offsets: npt.NDArray[np.int64]
    item_ids: npt.NDArray[np.str_]


def _check_shapes(table: str, value: Any, expected: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in expected.items():
        actual = getattr(value, name).shape
        if actual != shape:
            raise ConfigError(f"{table}.{name} has shape {actual}, expected {shape}")


Table = ItemTable | UserTable | SeenLists | PositiveLists
TableT = TypeVar("TableT", ItemTable, UserTable, SeenLists, PositiveLists)
_FILES: dict[type[Table], str] = {
    ItemTable: ITEMS_FILE,
    UserTable: USERS_FILE,
    SeenLists: SEEN_FILE,
    PositiveLists: POSITIVES_FILE,
}


def save_table(world: Path, table: Table) -> None:
    """One .npz per table, one array per field."""
    fields = {name: getattr(table, name) for name in type(table).__slots__}
    np.savez(world / _FILES[type(table)], **fields)


def _load_table(world: Path, kind: type[TableT]) -> TableT:
    with np.load(world / _FILES[kind]) as data:
        return kind(**{name: data[name] for name in kind.__slots__})


def load_items(world: Path) -> ItemTable:
    return _load_table(world, ItemTable)


def load_users(world: Path) -> UserTable:
    return _load_table(world, UserTable)


def load_seen(world: Path) -> SeenLists | None:
    """Seen lists are optional: an imported catalog has none."""
    if not (world / SEEN_FILE).is_file():
        return None
    return _load_table(world, SeenLists)


def load_positives(world: Path) -> PositiveLists | None:
    """Only worlds built from an interaction log have them."""
    if not (world / POSITIVES_FILE).is_file():
        return None
    return _load_table(world, PositiveLists)


def save_default_user(world: Path, users: UserTable) -> None:
    """The mean user, used for cold starts: it recalls broadly liked items."""
    embedding = users.embeddings.mean(axis=0)
    embedding /= max(float(np.linalg.norm(embedding)), 1e-6)
    blob = np.concatenate([embedding, users.dense.mean(axis=0)]).astype(np.float32)
    np.save(world / DEFAULT_USER_FILE, blob)


@dataclass(frozen=True, slots=True)
class HeldOut:
    rows: npt.NDArray[np.float32]  # (n, schema width)
    labels: npt.NDArray[np.int8]  # 1: the user took the item
    users: npt.NDArray[np.str_]  # each row's user id
    items: npt.NDArray[np.str_]  # each row's item id


def save_holdout(world: Path, held: HeldOut) -> None:
    """Labelled rows, packed as served, that the served model did not learn from, with the
    user and the item of each.

    `recsys model compare` scores them to judge a reduced-precision copy of the model.
    """
    np.savez(
        world / HOLDOUT_FILE,
        rows=held.rows.astype(np.float32),
        labels=held.labels.astype(np.int8),
        users=held.users.astype(np.str_),
        items=held.items.astype(np.str_),
    )
