"""Bringing a real catalog: NPZ tables in, a servable world directory out."""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recsys_tools.cli import main
from recsys_tools.world.read.importer import read_items

from app.core.errors import ConfigError
from app.release.catalog import load_catalog
from app.world.schema import load_schema


def _write_tables(folder: Path, n_items: int = 50, n_users: int = 5) -> tuple[Path, Path]:
    schema = load_schema()
    rng = np.random.default_rng(0)
    items: dict[str, Any] = {
        "item_id": np.array([f"sku-{i}" for i in range(n_items)]),
        "embedding": rng.standard_normal((n_items, schema.embedding_dim)).astype(np.float32),
        "category": np.array(["shoes", "hats"] * (n_items // 2)),
        "published_at": np.full(n_items, 1_700_000_000, dtype=np.int64),
        "popularity": np.arange(n_items, dtype=np.float32),
        **{name: rng.random(n_items).astype(np.float32) for name in schema.item_dense},
    }
    users: dict[str, Any] = {
        "user_id": np.array([f"member-{u}" for u in range(n_users)]),
        "embedding": rng.standard_normal((n_users, schema.embedding_dim)).astype(np.float32),
        **{name: rng.random(n_users).astype(np.float32) for name in schema.user_dense},
    }
    np.savez(folder / "items.npz", **items)
    np.savez(folder / "users.npz", **users)
    return folder / "items.npz", folder / "users.npz"


def test_import_catalog_writes_a_world_the_service_loads(tmp_path: Path) -> None:
    items, users = _write_tables(tmp_path)
    world = tmp_path / "world"
    code = main(
        ["import-catalog", "--items", str(items), "--users", str(users), "--world", str(world)]
    )
    assert code == 0
    catalog = load_catalog(world, load_schema(), nprobe=8)
    assert catalog.size == 50
    assert catalog.item_ids[0] == "sku-0"
    assert catalog.index.ntotal == 50
    assert catalog.popular_order[0] == 49  # the most popular first
    assert sorted(set(catalog.categories.tolist())) == [0, 1]


def test_missing_column_is_named(tmp_path: Path) -> None:
    items, _ = _write_tables(tmp_path)
    with np.load(items) as data:
        without = {name: data[name] for name in data.files if name != "popularity"}
    np.savez(items, **without)
    with pytest.raises(ConfigError, match="no column 'popularity'"):
        read_items(items, load_schema())


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"expected a \.parquet or \.npz"):
        read_items(tmp_path / "items.csv", load_schema())
