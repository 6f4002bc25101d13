"""holdout.npz as recsys model compare, build-engine's calibration and tune read it: the rows
the build saved, or one ConfigError naming the file, whatever the file holds."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recsys_tools.model.holdout import load_holdout

from app.core.errors import ConfigError
from app.world.layout import HOLDOUT_FILE
from app.world.schema import FeatureSchema, load_schema


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return load_schema()


def _rows(schema: FeatureSchema, n: int = 4) -> np.ndarray:
    return np.random.default_rng(3).random((n, schema.width)).astype(np.float32)


def test_the_saved_rows_are_read(tmp_path: Path, schema: FeatureSchema) -> None:
    rows, labels = _rows(schema), np.array([1, 0, 0, 1], dtype=np.int8)
    np.savez(tmp_path / HOLDOUT_FILE, rows=rows, labels=labels)
    held = load_holdout(tmp_path, schema)
    assert np.array_equal(held.rows, rows)
    assert np.array_equal(held.labels, labels)


def _writers(schema: FeatureSchema) -> dict[str, Callable[[Path], None]]:
    rows = _rows(schema)
    labels = np.array([1, 0, 0, 1], dtype=np.int8)
    return {
        "empty file": lambda path: path.write_bytes(b""),
        "text": lambda path: path.write_text("rows,labels\n"),
        "pickle": lambda path: path.write_bytes(pickle.dumps({"rows": rows})),
        "plain npy": lambda path: path.write_bytes(_npy_bytes(rows)),
        "no labels": lambda path: _savez(path, rows=rows),
        "objects": lambda path: _savez(
            path, rows=np.array([None] * 4, dtype=object), labels=labels
        ),
        "truncated zip": lambda path: path.write_bytes(_npz_bytes(rows, labels)[:300]),
        "wrong width": lambda path: _savez(path, rows=rows[:, :3], labels=labels),
        "labels of two columns": lambda path: _savez(
            path, rows=rows, labels=np.ones((4, 2), dtype=np.int8)
        ),
        "no rows": lambda path: _savez(path, rows=rows[:0], labels=labels[:0]),
        "strings": lambda path: _savez(path, rows=rows.astype(str), labels=labels),
        "not finite": lambda path: _savez(path, rows=rows * np.inf, labels=labels),
        "label 300": lambda path: _savez(path, rows=rows, labels=np.array([300, 0, 1, 0])),
    }


def _savez(path: Path, **arrays: Any) -> None:
    with path.open("wb") as file:
        np.savez(file, **arrays)


def _npz_bytes(rows: np.ndarray, labels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, rows=rows, labels=labels)
    return buffer.getvalue()


def _npy_bytes(rows: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, rows)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "kind",
    [
        "empty file",
        "text",
        "pickle",
        "plain npy",
        "no labels",
        "objects",
        "truncated zip",
        "wrong width",
        "labels of two columns",
        "no rows",
        "strings",
        "not finite",
        "label 300",
    ],
)
def test_a_file_that_is_not_held_out_rows_is_one_config_error(
    tmp_path: Path, schema: FeatureSchema, kind: str
) -> None:
    _writers(schema)[kind](tmp_path / HOLDOUT_FILE)
    with pytest.raises(ConfigError, match=rf"{HOLDOUT_FILE} .*rebuild the world"):
        load_holdout(tmp_path, schema)


def test_a_world_without_the_file_is_told_how_to_get_one(
    tmp_path: Path, schema: FeatureSchema
) -> None:
    with pytest.raises(ConfigError, match=f"{HOLDOUT_FILE} is missing: rebuild the world"):
        load_holdout(tmp_path, schema)
