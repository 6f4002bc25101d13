"""Building the FAISS inner-product index over item embeddings."""

from __future__ import annotations

import math
from pathlib import Path

import faiss
import numpy as np
import numpy.typing as npt

from app.world.layout import INDEX_FILE

# Below this many items an exact (flat) search is fast enough and needs no training.
FLAT_LIMIT = 20_000


def default_factory(n_items: int) -> str:
    """Flat for tiny catalogs; otherwise IVF with about 4*sqrt(n) lists."""
    if n_items < FLAT_LIMIT:
        return "Flat"
    return f"IVF{int(4 * math.sqrt(n_items))},Flat"


def build_index(
    embeddings: npt.NDArray[np.float32], factory: str = "auto", seed: int = 7
) -> faiss.Index:
    n_items, dim = embeddings.shape
    spec = default_factory(n_items) if factory == "auto" else factory
    index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
    if not index.is_trained:
        sample = vectors
        max_training = 256 * max(faiss.extract_index_ivf(index).nlist, 1)
        if n_items > max_training:
            rng = np.random.default_rng(seed)
            sample = vectors[rng.choice(n_items, size=max_training, replace=False)]
        index.train(sample)
    index.add(vectors)
    return index


def save_index(world: Path, index: faiss.Index) -> None:
    """Written beside, then renamed: a service that maps the old file keeps reading it whole."""
    partial = world / f".{INDEX_FILE}.partial"
    faiss.write_index(index, str(partial))
    partial.replace(world / INDEX_FILE)
