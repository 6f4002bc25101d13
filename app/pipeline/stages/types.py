"""Values handed from one stage to the next."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices, Positions, Removal, Scores


@dataclass(frozen=True, slots=True)
class Moment:
    """What the frontend knows about the moment of the request; hour and weekday in UTC."""

    device: str = "other"
    page: str = "other"
    locale: str = "other"
    hour: int | None = None
    weekday: int | None = None


@dataclass(frozen=True, slots=True)
class Query:
    """What one request asks for, in the pipeline's own terms."""

    user_id: str
    num_items: int
    exclude_item_ids: frozenset[str] = frozenset()
    moment: Moment = Moment()


@dataclass(frozen=True, slots=True)
class UserFeatures:
    blob: npt.NDArray[np.float32]
    context: npt.NDArray[np.float32]
    seen: Positions  # every item the user has seen, by catalog position
    cold_start: bool


@dataclass(frozen=True, slots=True)
class Filtered:
    """The candidates a filter kept, in order, and how many it removed for each reason."""

    kept: Positions
    removed: dict[Removal, int]


@dataclass(frozen=True, slots=True)
class HydratedCandidates:
    """Candidates in recall order, and the feature blobs of those that have them.

    `blobs[j]` belongs to `positions[found[j]]`. Candidates outside `found` have no features
    (missing in the store, or the read failed): they cannot be scored, but can still fill
    the answer after the scored ones.
    """

    positions: Positions
    found: Indices
    blobs: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Scored:
    """Candidates in recall order and their scores; NaN marks one that was not scored."""

    positions: Positions
    scores: Scores


@dataclass(frozen=True, slots=True)
class RankedItem:
    item_id: str
    score: float | None  # None: not scored by a model (a degraded answer's backfill)


@dataclass(frozen=True, slots=True)
class Recommendation:
    items: list[RankedItem]
    cold_start: bool
