"""Values handed from one stage to the next."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class UserFeatures:
    blob: npt.NDArray[np.float32]
    context: npt.NDArray[np.float32]
    seen: frozenset[str]
    cold_start: bool


@dataclass(frozen=True, slots=True)
class HydratedCandidates:
    """Catalog positions of the candidates, in recall order, with their item feature blobs.

    `blobs` is None when the fetch failed; the positions are then all that recall found.
    """

    positions: npt.NDArray[np.int64]
    blobs: npt.NDArray[np.float32] | None


@dataclass(frozen=True, slots=True)
class RankedItem:
    item_id: str
    score: float


@dataclass(frozen=True, slots=True)
class Recommendation:
    items: list[RankedItem]
    cold_start: bool
