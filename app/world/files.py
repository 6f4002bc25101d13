"""Reading and writing a world directory (the layout is documented in app.catalog)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.catalog import DEFAULT_USER_FILE, ITEMS_FILE, USERS_FILE
from app.errors import ConfigError
from app.schema import FeatureSchema

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
SEEN_FILE = "seen.npz"


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


def _check_shapes(table: str, value: Any, expected: Mapping[str, tuple[int, ...]]) -> None:
    for name, shape in expected.items():
        actual = getattr(value, name).shape
        if actual != shape:
            raise ConfigError(f"{table}.{name} has shape {actual}, expected {shape}")


def save_items(world: Path, items: ItemTable) -> None:
    np.savez(world / ITEMS_FILE, **{f: getattr(items, f) for f in ItemTable.__slots__})


def load_items(world: Path) -> ItemTable:
    with np.load(world / ITEMS_FILE) as data:
        return ItemTable(
            ids=data["ids"].astype(np.str_),
            embeddings=data["embeddings"].astype(np.float32),
            dense=data["dense"].astype(np.float32),
            categories=data["categories"].astype(np.int64),
            published_at=data["published_at"].astype(np.int64),
            popularity=data["popularity"].astype(np.float32),
        )


def save_users(world: Path, users: UserTable) -> None:
    np.savez(world / USERS_FILE, **{f: getattr(users, f) for f in UserTable.__slots__})


def load_users(world: Path) -> UserTable:
    with np.load(world / USERS_FILE) as data:
        return UserTable(
            ids=data["ids"].astype(np.str_),
            embeddings=data["embeddings"].astype(np.float32),
            dense=data["dense"].astype(np.float32),
        )


def save_seen(world: Path, seen: SeenLists) -> None:
    np.savez(world / SEEN_FILE, **{f: getattr(seen, f) for f in SeenLists.__slots__})


def load_seen(world: Path) -> SeenLists | None:
    path = world / SEEN_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return SeenLists(
            user_ids=data["user_ids"].astype(np.str_),
            offsets=data["offsets"].astype(np.int64),
            item_ids=data["item_ids"].astype(np.str_),
        )


def save_default_user(world: Path, users: UserTable) -> None:
    """The mean user, used for cold starts: it recalls broadly liked items."""
    embedding = users.embeddings.mean(axis=0)
    embedding /= max(float(np.linalg.norm(embedding)), 1e-6)
    blob = np.concatenate([embedding, users.dense.mean(axis=0)]).astype(np.float32)
    np.save(world / DEFAULT_USER_FILE, blob)


def write_manifest(world: Path, **fields: Any) -> None:
    path = world / MANIFEST_FILE
    current = json.loads(path.read_text()) if path.is_file() else {}
    current.update(fields)
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


def read_manifest(world: Path) -> dict[str, Any]:
    path = world / MANIFEST_FILE
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    return data
