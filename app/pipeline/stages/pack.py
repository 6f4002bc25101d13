"""Stage `pack`: the model's fixed-width rows, one per candidate that has features."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Stage
from app.pipeline.context import RequestContext
from app.pipeline.packing import pack_rows
from app.pipeline.signals import prerank_signals, sequence_columns
from app.pipeline.types import Hydrated, Packed


class RowPacker:
    """Packs each hydrated candidate's row; where the schema declares sequence signals, they
    are computed here, in process, from the held item vectors and the user's latest items."""

    stage = Stage.PACK

    def __init__(self, decay: float = 0.9) -> None:
        self._decay = decay

    def _sequence(self, hydrated: Hydrated, ctx: RequestContext) -> npt.NDArray[np.float32] | None:
        schema, catalog = ctx.artifacts.schema, ctx.artifacts.catalog
        if not schema.sequence:
            return None
        items, user = hydrated.items, hydrated.asked.user
        if catalog.vectors is None:
            return np.zeros((len(items.found), len(schema.sequence)), np.float32)
        signals = prerank_signals(
            items.positions[items.found],
            user.blob[: schema.embedding_dim],
            user.recent,
            catalog.vectors,
            user.nearby,
            self._decay,
            catalog.categories,
            taste=user.taste,
        )
        return sequence_columns(schema, signals)

    async def run(self, hydrated: Hydrated, ctx: RequestContext) -> Packed:
        schema = ctx.artifacts.schema
        items, user = hydrated.items, hydrated.asked.user
        rows = (
            pack_rows(
                schema,
                user.blob,
                items.blobs,
                user.context_row,
                sequence=self._sequence(hydrated, ctx),
            )
            if len(items.found)
            else np.empty((0, schema.width), np.float32)
        )
        return Packed(hydrated, rows)
