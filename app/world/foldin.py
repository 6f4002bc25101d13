"""The world's fold-in parameters: how its user vectors were fitted, so new ones match.

Written by the world build beside the catalog (`foldin.npz`). A user's vector is folded in
from the item vectors with the build's own confidence weighting and regularisation (the
implicit ALS user step, app.ingest.foldin); with other ones it would live in another space
than the items it is searched against.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.world.layout import FOLDIN_FILE
from app.world.stored import reading

# BM25 as the build weighs each user's positives (implicit's bm25_weight): it damps heavy users
# and very popular items, so the factors model taste, not volume.
BM25_K1 = 100.0
BM25_B = 0.8


class Weighting(StrEnum):
    COUNT = "count"  # confidence = how often the user chose the item
    BM25 = "bm25"  # implicit's bm25_weight over those counts


@dataclass(frozen=True, slots=True)
class FoldInParams:
    weighting: Weighting
    regularization: float
    # BM25 only: each item's idf over the build's users, the users' mean count, K1 and B.
    idf: npt.NDArray[np.float32]
    average_length: float = 1.0
    k1: float = BM25_K1
    b: float = BM25_B
    # The most positives any user had at the build: the `activity` feature's scale.
    max_user_positives: int = 0


def bm25_idf(users: int, choosers: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Each item's idf as implicit's bm25_weight takes it: log(users) - log1p(users who
    chose the item)."""
    idf: npt.NDArray[np.float64] = np.log(float(users)) - np.log1p(choosers)
    return idf


def bm25(counts: Any, length: Any, average_length: float, idf: Any, k1: float, b: float) -> Any:
    """implicit's bm25_weight of a user's `counts` of items (their row's sum `length`), written
    once for every place that weighs: the fold-in on numpy arrays, the Spark engine on
    columns (the same expression over either; the build's own matrix is implicit's, which
    tests/unit/test_bm25.py holds this to)."""
    norm = (1.0 - b) + b * length / average_length
    return counts * (k1 + 1.0) / (k1 * norm + counts) * idf


# What a world without the file (built before it existed, or imported) is folded with.
PLAIN = FoldInParams(Weighting.COUNT, 0.05, np.empty(0, dtype=np.float32))


def save_foldin(world: Path, params: FoldInParams) -> None:
    np.savez(
        world / FOLDIN_FILE,
        weighting=np.array(params.weighting.value),
        regularization=np.float64(params.regularization),
        idf=params.idf.astype(np.float32),
        average_length=np.float64(params.average_length),
        k1=np.float64(params.k1),
        b=np.float64(params.b),
        max_user_positives=np.int64(params.max_user_positives),
    )


def load_foldin(world: Path, n_items: int) -> FoldInParams | None:
    """The world's parameters; None when it has no file; ConfigError when it is damaged."""
    path = world / FOLDIN_FILE
    if not path.is_file():
        return None
    with reading(path), np.load(path) as stored:
        params = FoldInParams(
            weighting=Weighting(str(stored["weighting"])),
            regularization=float(stored["regularization"]),
            idf=stored["idf"].astype(np.float32),
            average_length=float(stored["average_length"]),
            k1=float(stored["k1"]),
            b=float(stored["b"]),
            max_user_positives=int(stored["max_user_positives"]),
        )
    if params.weighting is Weighting.BM25 and len(params.idf) != n_items:
        raise ConfigError(f"{path} has {len(params.idf)} idf values for {n_items} items")
    return params
