"""Stage `filter`: every rule that removes a candidate, applied once, before any feature read.

Removes blocked items (the rules' block list), items the user has seen and items the request
excludes, and says how many went for each reason. When fewer than the answer needs are left,
it backfills from the popular list, so a filter never makes the answer short while the
catalog has items to give.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import numpy.typing as npt

from app.artifacts import ServingArtifacts
from app.metrics import Removal
from app.stages.types import Filtered, Positions


def _among(ids: npt.NDArray[np.str_], item_ids: Collection[str]) -> npt.NDArray[np.bool_]:
    if not item_ids:
        return np.zeros(len(ids), dtype=bool)
    return np.isin(ids, np.array(list(item_ids), dtype=np.str_))


def _backfill(
    artifacts: ServingArtifacts, present: Positions, unwanted: Collection[str], count: int
) -> Positions:
    """Up to `count` popular items that are neither present nor unwanted (rarely needed)."""
    reserve = artifacts.popular[~np.isin(artifacts.popular, present)]
    reserve = reserve[~_among(artifacts.catalog.item_ids[reserve], unwanted)]
    return reserve[:count]


class CandidateFilter:
    def filter(
        self,
        positions: Positions,
        seen: Collection[str],
        excluded: Collection[str],
        at_least: int,
        artifacts: ServingArtifacts,
    ) -> Filtered:
        blocked = artifacts.blocked[positions]
        ids = artifacts.catalog.item_ids[positions]
        was_seen = _among(ids, seen)
        was_excluded = _among(ids, excluded) & ~was_seen
        removed_mask = blocked | was_seen | was_excluded
        kept = positions[~removed_mask]
        removed = {
            Removal.BLOCKED: int(blocked.sum()),
            Removal.SEEN: int((was_seen & ~blocked).sum()),
            Removal.EXCLUDED: int((was_excluded & ~blocked).sum()),
        }
        if len(kept) < at_least:
            unwanted = set(seen) | set(excluded)
            kept = np.concatenate(
                [kept, _backfill(artifacts, positions, unwanted, at_least - len(kept))]
            )
        return Filtered(kept, removed)
