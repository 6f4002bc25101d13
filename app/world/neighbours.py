"""Each item's nearest items, as the world build measured them from what users did.

neighbours.npz holds `positions` (n_items x k, int32 catalog positions, -1 past an item's
last neighbour) and `similarity` (n_items x k, float32, descending per row). The build
computes them from co-occurrence in the log (item-to-item cosine over users, or with
`--neighbours ease` EASE's item weights, on a scale about a tenth of cosine's); the service
recalls the neighbours of a user's most recent items with them, and the pre-rank stage
scores candidates by how close they are to those items. A world without the file has no
item-to-item source: recall and pre-rank work from the user's vector alone.

page_neighbours.npz, the same two arrays, is the item page's list where the build scored the
feed's by another model: an EASE build keeps cosine's for the page, where cosine's lists
served the next item better (docs/benchmarks.md, item pages). Without it the page reads
neighbours.npz.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.core.vocabulary import Positions
from app.world.layout import NEIGHBOURS_FILE, PAGE_NEIGHBOURS_FILE
from app.world.stored import reading


@dataclass(frozen=True, slots=True)
class Nearby:
    """Items near a user's latest positives, best first, each with its summed similarity:
    found once per request, read by the similar source, pre-rank and the packer."""

    items: Positions
    scores: npt.NDArray[np.float32]


NOWHERE = Nearby(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))


@dataclass(frozen=True, slots=True)
class Neighbours:
    positions: npt.NDArray[np.int32]
    similarity: npt.NDArray[np.float32]

    @property
    def k(self) -> int:
        return int(self.positions.shape[1])

    def of(self, item: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """The item's neighbours and their similarity, closest first (-1 pads); none for an
        item past the world's, one added while serving."""
        if item >= len(self.positions):
            return np.empty(0, self.positions.dtype), np.empty(0, self.similarity.dtype)
        return self.positions[item], self.similarity[item]

    def around(self, recent: Positions, decay: float) -> Nearby:
        """Items near the `recent` ones (oldest first), each scored by its similarity to
        them, a more recent item's counting more (`decay` per step back); best first. An
        item added while serving is near none."""
        weights = decay ** np.arange(len(recent) - 1, -1, -1, dtype=np.float32)
        known = recent < len(self.positions)
        recent, weights = recent[known], weights[known]
        if len(recent) == 0:
            return NOWHERE
        near = self.positions[recent].ravel()
        score = (self.similarity[recent] * weights[:, None]).ravel()
        valid = near >= 0
        items, inverse = np.unique(near[valid], return_inverse=True)
        totals = np.bincount(inverse, weights=score[valid], minlength=len(items))
        order = np.argsort(-totals, kind="stable")
        return Nearby(items[order].astype(np.int64), totals[order].astype(np.float32))


def save_neighbours(world: Path, neighbours: Neighbours, name: str = NEIGHBOURS_FILE) -> None:
    np.savez(
        world / name,
        positions=neighbours.positions.astype(np.int32),
        similarity=neighbours.similarity.astype(np.float32),
    )


def load_neighbours(world: Path, n_items: int, name: str = NEIGHBOURS_FILE) -> Neighbours | None:
    """The world's neighbours (`name`: the feed's, or PAGE_NEIGHBOURS_FILE), or None when it
    has none (a world built before them)."""
    path = world / name
    if not path.is_file():
        return None
    with reading(path), np.load(path) as stored:
        positions = stored["positions"]
        similarity = stored["similarity"]
    # Checked as stored, before any cast: int64 positions from 2**32 up would wrap into
    # range as int32, and float ones be truncated into it.
    if positions.dtype.kind not in "iu" or similarity.dtype.kind != "f":
        raise ConfigError(
            f"{path} holds {positions.dtype} positions and {similarity.dtype} similarities "
            "(integers and floats expected): rebuild the world"
        )
    if positions.ndim != 2 or positions.shape != similarity.shape or len(positions) != n_items:
        raise ConfigError(
            f"{path} holds {positions.shape} neighbours for a catalog of {n_items} items"
        )
    if positions.size and (int(positions.max()) >= n_items or int(positions.min()) < -1):
        raise ConfigError(f"{path} names positions past the catalog: rebuild the world")
    with np.errstate(over="ignore"):  # a float64 past float32's range: Inf, refused below
        served = similarity.astype(np.float32)
    if not np.isfinite(served).all():
        raise ConfigError(f"{path} holds NaN, Inf or a value past float32's: rebuild the world")
    return Neighbours(positions.astype(np.int32), served)


def load_page_neighbours(world: Path, n_items: int) -> Neighbours | None:
    """What an item page reads: the page's own list, or the feed's where there is none."""
    page = load_neighbours(world, n_items, PAGE_NEIGHBOURS_FILE)
    return page if page is not None else load_neighbours(world, n_items)
