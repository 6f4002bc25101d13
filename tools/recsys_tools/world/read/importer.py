"""Bringing a real catalog: item and user tables from Parquet or NPZ files.

Items need the columns `item_id`, `embedding` (a list of floats per row, or an (n, dim) array
in NPZ), `category`, `published_at` (unix seconds), `popularity` and one column per item dense
feature named in the schema. Users need `user_id`, `embedding` and the user dense columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import ConfigError
from app.world.schema import FeatureSchema
from app.world.tables import ItemTable, UserTable


def read_columns(path: Path) -> dict[str, Any]:
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError("reading Parquet needs the 'parquet' extra (pyarrow)") from exc
        table = pq.read_table(path)
        return {name: table.column(name).to_pylist() for name in table.column_names}
    raise ConfigError(f"{path}: expected a .parquet or .npz file")


def _column(columns: dict[str, Any], name: str, path: Path) -> Any:
    if name not in columns:
        raise ConfigError(f"{path} has no column {name!r} (has {sorted(columns)})")
    return columns[name]


def _matrix(columns: dict[str, Any], names: tuple[str, ...], path: Path) -> np.ndarray[Any, Any]:
    if not names:
        n = len(next(iter(columns.values())))
        return np.zeros((n, 0), dtype=np.float32)
    return np.stack([np.asarray(_column(columns, n, path), np.float32) for n in names], axis=1)


def _category_codes(values: Any) -> np.ndarray[Any, Any]:
    """Categories may be names or numbers; the service only needs equal-means-same codes."""
    _, codes = np.unique(np.asarray(values).astype(str), return_inverse=True)
    return codes.astype(np.int64)


def read_items(path: Path, schema: FeatureSchema) -> ItemTable:
    columns = read_columns(path)
    return ItemTable(
        ids=np.asarray(_column(columns, "item_id", path)).astype(np.str_),
        embeddings=np.asarray(_column(columns, "embedding", path), dtype=np.float32),
        dense=_matrix(columns, schema.item_dense, path),
        categories=_category_codes(_column(columns, "category", path)),
        published_at=np.asarray(_column(columns, "published_at", path), dtype=np.int64),
        popularity=np.asarray(_column(columns, "popularity", path), dtype=np.float32),
    )


def read_users(path: Path, schema: FeatureSchema) -> UserTable:
    columns = read_columns(path)
    return UserTable(
        ids=np.asarray(_column(columns, "user_id", path)).astype(np.str_),
        embeddings=np.asarray(_column(columns, "embedding", path), dtype=np.float32),
        dense=_matrix(columns, schema.user_dense, path),
    )
