"""How item attributes map to item vectors: a ridge regression the build fits and measures.

Inputs: each item's categories (one column each), its title's words (hashed into
TITLE_BUCKETS columns) and its dense features (standardized). Outputs: the item's vector
around their mean. The penalty is chosen on a tenth of the items held out (the mean cosine
between guess and vector), which is also what the report gives, beside two simpler guesses:
the mean vector of everything, and the mean of the item's first category.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.sparse

from app.world.item_prior import TITLE_BUCKETS, ItemPrior, attribute_row
from recsys_tools.world.read.items import ItemInfo

FloatArray = npt.NDArray[np.float32]
PENALTIES = (0.3, 3.0, 30.0, 300.0)
HELD_OUT_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class ItemAttributesIn:
    """What the build knows of every item, in catalog order."""

    category_names: tuple[str, ...]
    codes: Sequence[Sequence[int]]
    titles: Sequence[str]
    dense: FloatArray


@dataclass(frozen=True, slots=True)
class PriorReport:
    penalty: float
    items_held_out: int
    cosine: float  # mean cosine, guess to vector, on the held-out items
    cosine_first_category: float
    cosine_mean: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "penalty": self.penalty,
            "items_held_out": self.items_held_out,
            "cosine": round(self.cosine, 4),
            "cosine_first_category": round(self.cosine_first_category, 4),
            "cosine_mean": round(self.cosine_mean, 4),
        }


def _design(
    attributes: ItemAttributesIn, mean: FloatArray, scale: FloatArray
) -> scipy.sparse.csr_matrix:
    n_categories = len(attributes.category_names)
    rows: list[int] = []
    columns: list[int] = []
    for i, (codes, title) in enumerate(zip(attributes.codes, attributes.titles, strict=True)):
        row = attribute_row(
            codes, title, attributes.dense[i], n_categories, TITLE_BUCKETS, mean, scale
        )
        rows.extend([i] * len(row.columns))
        columns.extend(row.columns)
    n = len(attributes.titles)
    sparse = scipy.sparse.csr_matrix(
        (np.ones(len(rows), dtype=np.float64), (rows, columns)),
        shape=(n, n_categories + TITLE_BUCKETS),
    )
    dense = (attributes.dense - mean) / scale
    return scipy.sparse.hstack([sparse, scipy.sparse.csr_matrix(dense)], format="csr")


@dataclass(frozen=True, slots=True)
class _Normal:
    """The normal equations' two products, made once for every penalty tried."""

    gram: npt.NDArray[np.float64]
    xty: npt.NDArray[np.float64]

    @classmethod
    def of(cls, x: scipy.sparse.csr_matrix, y: npt.NDArray[np.float64]) -> _Normal:
        return cls((x.T @ x).toarray(), np.asarray(x.T @ y))

    def solve(self, penalty: float) -> FloatArray:
        gram = self.gram + penalty * np.eye(len(self.gram))
        weights = scipy.linalg.cho_solve(scipy.linalg.cho_factor(gram), self.xty)
        return np.asarray(weights, dtype=np.float32)


def _cosine(guess: npt.NDArray[np.floating], truth: npt.NDArray[np.floating]) -> float:
    norms = np.linalg.norm(guess, axis=1) * np.linalg.norm(truth, axis=1)
    valid = norms > 0
    return float(np.mean((guess * truth).sum(axis=1)[valid] / norms[valid])) if valid.any() else 0.0


def _first_category_guess(
    codes: Sequence[Sequence[int]],
    vectors: FloatArray,
    train: npt.NDArray[np.intp],
    test: npt.NDArray[np.intp],
    n_categories: int,
) -> npt.NDArray[np.float64]:
    first = np.array([c[0] if len(c) else n_categories for c in codes], dtype=np.int64)
    sums = np.zeros((n_categories + 1, vectors.shape[1]))
    np.add.at(sums, first[train], vectors[train])
    counts = np.bincount(first[train], minlength=n_categories + 1)[:, None]
    centroids = np.where(counts > 0, sums / np.maximum(counts, 1), vectors[train].mean(axis=0))
    guess: npt.NDArray[np.float64] = centroids[first[test]]
    return guess


def log_attributes(items: ItemInfo, dense: FloatArray) -> ItemAttributesIn:
    """A log's item table as the prior reads it: every listed category, the title."""
    offsets = items.category_offsets.tolist()
    codes = [items.category_codes[offsets[i] : offsets[i + 1]].tolist() for i in range(items.size)]
    titles = [""] * items.size if items.titles is None else items.titles.tolist()
    return ItemAttributesIn(items.category_names, codes, titles, dense)


def fit_item_prior(
    attributes: ItemAttributesIn, vectors: FloatArray, seed: int
) -> tuple[ItemPrior, PriorReport]:
    """Fit on a nine-tenths split to choose the penalty and report, then on every item.

    Items whose vector is all zeros (nobody chose them) teach nothing and are left out."""
    taught = np.flatnonzero(np.abs(vectors).sum(axis=1) > 0)
    dense_mean = attributes.dense.mean(axis=0).astype(np.float32)
    dense_scale = np.maximum(attributes.dense.std(axis=0), 1e-6).astype(np.float32)
    x = _design(attributes, dense_mean, dense_scale)
    y = vectors.astype(np.float64)
    order = np.random.default_rng(seed).permutation(taught)
    cut = max(1, int(len(order) * HELD_OUT_SHARE))
    test, train = order[:cut], order[cut:]
    mean = y[train].mean(axis=0)
    normal = _Normal.of(x[train], y[train] - mean)
    scores = {p: _cosine(x[test] @ normal.solve(p) + mean, y[test]) for p in PENALTIES}
    penalty = max(scores, key=lambda p: scores[p])
    n_categories = len(attributes.category_names)
    report = PriorReport(
        penalty,
        len(test),
        scores[penalty],
        _cosine(
            _first_category_guess(attributes.codes, vectors, train, test, n_categories), y[test]
        ),
        _cosine(np.broadcast_to(mean, y[test].shape), y[test]),
    )
    whole_mean = y[taught].mean(axis=0)
    weights = _Normal.of(x[taught], y[taught] - whole_mean).solve(penalty)
    prior = ItemPrior(
        attributes.category_names,
        TITLE_BUCKETS,
        weights,
        whole_mean.astype(np.float32),
        dense_mean,
        dense_scale,
    )
    return prior, report
