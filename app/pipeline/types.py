"""Values handed from one stage to the next.

Query -features-> Asked -recall-> Pool -filter-> Pool -prerank-> Pool -fetch-> Hydrated
-pack-> Packed -rank-> Ranked -rerank-> Recommendation. Each says how many candidates it
carries, which the pipeline's runner counts for the stage that made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Heads, Indices, Positions, Removal, Scores, Variant
from app.release.rules import PageSources
from app.world.neighbours import NOWHERE, Nearby
from app.world.order import NO_TASTE, Taste

NOTHING: Positions = np.empty(0, dtype=np.int64)
EVERY_SETTING = PageSources()  # a page section that sizes no source: the settings' sizes


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
    viewed_item_id: str | None = None  # the item an item page shows


@dataclass(frozen=True, slots=True)
class UserFeatures:
    blob: npt.NDArray[np.float32]
    context_row: npt.NDArray[np.float32]  # the request's Moment, encoded as the schema's block
    seen: Positions  # every item the user has seen, by catalog position
    cold_start: bool
    recent: Positions = field(default_factory=lambda: NOTHING)  # latest positives, oldest first
    nearby: Nearby = NOWHERE  # the items near those, from the world's neighbours
    # The catalog position of the item the page shows, also the last of `recent`; -1: none.
    viewed: int = -1
    taste: Taste = NO_TASTE  # what the world's order model makes of `recent`


@dataclass(frozen=True, slots=True)
class Asked:
    """The request and what is known of its user: what every later stage reads."""

    query: Query
    user: UserFeatures

    @property
    def candidates(self) -> int:
        return 0  # none yet: recall makes them

    @property
    def at_least(self) -> int:
        """Candidates recall must find for the answer to be full after the filters."""
        query = self.query
        viewed = 1 if self.user.viewed >= 0 else 0
        return query.num_items + len(self.user.seen) + len(query.exclude_item_ids) + viewed


@dataclass(frozen=True, slots=True)
class Recalling:
    """What the candidate sources are asked for: `wanted` candidates for this request, each
    source as many as its page's `sources` say (or its own setting)."""

    asked: Asked
    wanted: int
    sources: PageSources = EVERY_SETTING


@dataclass(frozen=True, slots=True)
class Pool:
    """Candidates in recall order (after the filters: those kept, then any backfill)."""

    asked: Asked
    positions: Positions

    @property
    def candidates(self) -> int:
        return len(self.positions)


@dataclass(frozen=True, slots=True)
class Filtered:
    """What one filter kept, in order, what it removed, and why."""

    kept: Positions
    removed: Positions
    reason: Removal


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
class Hydrated:
    """The candidates with their item features, for the request they belong to."""

    asked: Asked
    items: HydratedCandidates

    @property
    def candidates(self) -> int:
        return len(self.items.found)


@dataclass(frozen=True, slots=True)
class Packed:
    """The model's input: one fixed-width FP32 row per candidate with features, in order."""

    hydrated: Hydrated
    rows: npt.NDArray[np.float32]

    @property
    def candidates(self) -> int:
        return len(self.rows)


@dataclass(frozen=True, slots=True)
class ModelUsed:
    """Which model scored the answer: FALLBACK (and no version) when Triton did not."""

    variant: Variant = Variant.FALLBACK
    version: str = ""


@dataclass(frozen=True, slots=True)
class Scored:
    """Candidates in recall order and their scores; NaN marks one that was not scored.
    `heads`, [candidates, heads], where the model answered each head's probability."""

    positions: Positions
    scores: Scores
    heads: Heads | None = None


@dataclass(frozen=True, slots=True)
class Ranked:
    """The candidates and their scores, and the model that scored them."""

    asked: Asked
    scored: Scored
    model: ModelUsed

    @property
    def candidates(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.scored.scores)))


@dataclass(frozen=True, slots=True)
class RankedItem:
    item_id: str
    score: float | None  # None: not scored by a model (a degraded answer's backfill)


@dataclass(frozen=True, slots=True)
class Recommendation:
    items: list[RankedItem]
    cold_start: bool
    model: ModelUsed = ModelUsed()

    @property
    def candidates(self) -> int:
        return len(self.items)
