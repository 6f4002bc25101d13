"""Stage `filter`: every rule that removes a candidate, applied once, before any feature read.

Removes blocked items (the rules' block list), items the user has seen and items the request
excludes, and says how many went for each reason. When fewer than the answer needs are left,
it backfills from the popular list, so a filter never makes the answer short while the
catalog has items to give.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from app.core.membership import member_mask
from app.core.vocabulary import Positions, Removal
from app.pipeline.stages.types import Filtered
from app.release.artifacts import ServingArtifacts


def _backfill(
    artifacts: ServingArtifacts, present: Positions, unwanted: Positions, count: int
) -> Positions:
    """Up to `count` popular items that are neither present nor unwanted (rarely needed)."""
    reserve = artifacts.popular
    reserve = reserve[~member_mask(reserve, np.concatenate([present, unwanted]))]
    return reserve[:count]


class CandidateFilter:
    def filter(
        self,
        positions: Positions,
        seen_at: Positions,
        excluded: Collection[str],
        at_least: int,
        artifacts: ServingArtifacts,
    ) -> Filtered:
        # Ids the catalog lacks cannot be candidates, so they drop out here.
        excluded_at = artifacts.positions_of(excluded)
        blocked = artifacts.blocked[positions]
        was_seen = member_mask(positions, seen_at)
        was_excluded = member_mask(positions, excluded_at) & ~was_seen
        removed_mask = blocked | was_seen | was_excluded
        kept = positions[~removed_mask]
        removed = {
            Removal.BLOCKED: int(blocked.sum()),
            Removal.SEEN: int((was_seen & ~blocked).sum()),
            Removal.EXCLUDED: int((was_excluded & ~blocked).sum()),
        }
        if len(kept) < at_least:
            unwanted = np.concatenate([seen_at, excluded_at])
            kept = np.concatenate(
                [kept, _backfill(artifacts, positions, unwanted, at_least - len(kept))]
            )
        return Filtered(kept, removed)
