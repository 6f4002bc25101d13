"""After the filters: popular items fill an answer they left short.

A filter never makes the answer short while the catalog has items to give: when fewer than
the answer needs are kept, the most popular items that were neither recalled nor unwanted
(seen, excluded, the item the page shows) follow the kept ones. The popular list holds no
blocked item.
"""

from __future__ import annotations

import numpy as np

from app.core.membership import member_mask
from app.pipeline.context import RequestContext
from app.pipeline.types import Pool


class PopularBackfill:
    async def fill(self, recalled: Pool, kept: Pool, ctx: RequestContext) -> Pool:
        asked = kept.asked
        short = asked.query.num_items - len(kept.positions)
        if short <= 0:
            return kept
        artifacts = ctx.artifacts
        excluded_at = artifacts.positions_of(asked.query.exclude_item_ids)
        viewed = np.array([asked.user.viewed], dtype=np.int64)
        absent = np.concatenate([recalled.positions, asked.user.seen, excluded_at, viewed])
        reserve = artifacts.popular[~member_mask(artifacts.popular, absent)]
        if artifacts.withdrawn is not None:
            reserve = reserve[~artifacts.withdrawn[reserve]]
        return Pool(asked, np.concatenate([kept.positions, reserve[:short]]))
