"""Stage `pack`: the model's fixed-width rows, one per candidate that has features."""

from __future__ import annotations

import numpy as np

from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext
from app.pipeline.packing import pack_rows
from app.pipeline.stages.types import Hydrated, Packed


class RowPacker:
    stage = Stage.PACK

    async def run(self, hydrated: Hydrated, ctx: RequestContext) -> Packed:
        schema = ctx.artifacts.schema
        items, user = hydrated.items, hydrated.asked.user
        rows = (
            pack_rows(schema, user.blob, items.blobs, user.context_row)
            if len(items.found)
            else np.empty((0, schema.width), np.float32)
        )
        return Packed(hydrated, rows)
