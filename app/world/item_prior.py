"""An item's vector guessed from its attributes, for an item nobody has chosen yet.

The world build fits a ridge regression from what an item is (its categories, the words of
its title, its dense features) to the vector the log gave it, and writes it beside the
catalog (`item_prior.npz`). An item added while serving without an embedding gets this
guess at once; the ingest consumer then moves it towards what its users did. Both sides
read an item's attributes with `attribute_row`, so the build and the service cannot
disagree on a word or a category.

The file holds `category_names` (by category code, as the catalog's `categories`),
`buckets` (title words are hashed into that many columns), `weights` (features x dim),
`mean` (the vectors' mean, which the weights predict around), and the dense features'
`dense_mean` and `dense_scale`.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.world.layout import ITEM_PRIOR_FILE
from app.world.stored import reading

TITLE_BUCKETS = 2048
_WORD = re.compile(r"[^\W_]+")
FloatArray = npt.NDArray[np.float32]


def title_words(title: str) -> list[str]:
    """The title's words, lower case, each once, in order."""
    return list(dict.fromkeys(_WORD.findall(title.lower())))


def word_bucket(word: str, buckets: int) -> int:
    """A stable hash: the same column in every process and every build."""
    return zlib.crc32(word.encode()) % buckets


@dataclass(frozen=True, slots=True)
class AttributeRow:
    """One item's attributes as column indexes (categories, then title words) and its
    standardized dense features: a sparse row of the regression's inputs."""

    columns: list[int]
    dense: FloatArray


def attribute_row(
    codes: Sequence[int],
    title: str,
    dense: FloatArray,
    n_categories: int,
    buckets: int,
    dense_mean: FloatArray,
    dense_scale: FloatArray,
) -> AttributeRow:
    words = [n_categories + word_bucket(word, buckets) for word in title_words(title)]
    scaled = ((dense - dense_mean) / dense_scale).astype(np.float32)
    return AttributeRow(sorted(set(codes)) + sorted(set(words)), scaled)


@dataclass(frozen=True, slots=True)
class ItemPrior:
    category_names: tuple[str, ...]
    buckets: int
    weights: FloatArray  # (categories + buckets + dense, dim)
    mean: FloatArray
    dense_mean: FloatArray
    dense_scale: FloatArray

    @property
    def n_categories(self) -> int:
        return len(self.category_names)

    def code(self, name: str) -> int | None:
        """A category's code, None for a name the world does not know."""
        try:
            return self.category_names.index(name)
        except ValueError:
            return None

    def row(self, codes: Sequence[int], title: str, dense: FloatArray) -> AttributeRow:
        return attribute_row(
            codes,
            title,
            dense,
            self.n_categories,
            self.buckets,
            self.dense_mean,
            self.dense_scale,
        )

    def vector(self, codes: Sequence[int], title: str, dense: FloatArray) -> FloatArray:
        """The guess for an item with these category codes, title and dense features."""
        row = self.row(codes, title, dense)
        sparse = self.weights[row.columns].sum(axis=0) if row.columns else 0.0
        dense_part = row.dense @ self.weights[self.n_categories + self.buckets :]
        guess: FloatArray = (self.mean + sparse + dense_part).astype(np.float32)
        return guess


def save_item_prior(world: Path, prior: ItemPrior) -> None:
    np.savez(
        world / ITEM_PRIOR_FILE,
        category_names=np.asarray(prior.category_names, dtype=np.str_),
        buckets=np.int64(prior.buckets),
        weights=prior.weights.astype(np.float32),
        mean=prior.mean.astype(np.float32),
        dense_mean=prior.dense_mean.astype(np.float32),
        dense_scale=prior.dense_scale.astype(np.float32),
    )


def load_item_prior(world: Path, dim: int, n_dense: int) -> ItemPrior | None:
    """The world's prior; None for a world built without one."""
    path = world / ITEM_PRIOR_FILE
    if not path.is_file():
        return None
    with reading(path), np.load(path) as stored:
        prior = ItemPrior(
            tuple(str(name) for name in stored["category_names"].tolist()),
            int(stored["buckets"]),
            stored["weights"].astype(np.float32),
            stored["mean"].astype(np.float32),
            stored["dense_mean"].astype(np.float32),
            stored["dense_scale"].astype(np.float32),
        )
    rows = prior.n_categories + prior.buckets + n_dense
    if prior.weights.shape != (rows, dim) or prior.mean.shape != (dim,):
        raise ConfigError(
            f"{path} holds weights {prior.weights.shape} for {rows} inputs and {dim} "
            "dimensions: rebuild the world"
        )
    if prior.dense_mean.shape != (n_dense,) or prior.dense_scale.shape != (n_dense,):
        raise ConfigError(f"{path} does not match the schema's item dense features")
    finite = [prior.weights, prior.mean, prior.dense_mean, prior.dense_scale]
    if not all(np.isfinite(array).all() for array in finite) or (prior.dense_scale <= 0).any():
        raise ConfigError(f"{path} holds NaN, Inf or a zero scale: rebuild the world")
    return prior
