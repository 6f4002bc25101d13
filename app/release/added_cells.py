"""Items added while serving, filed under the world IVF index's coarse cells.

The world's FAISS index answers for the items it was built with by scanning the few cells
(`nprobe` of them) nearest the query; the added items live outside it. Filed under the same
cells when they are applied (the index's own quantizer says which), they are searched the
same way: the cells the query probes, then exact inner products over the added items filed
there, a few hundred of ten thousand. A world whose index has no cells (a flat index, small
catalogs) has no filing: its added items are scanned whole.

The filing owns a copy of the index's quantizer (its centroids, a few hundred vectors): the
index's own is a view into an index that a reload replaces and frees while the filing,
which the catalog's room carries over, lives on.
"""

from __future__ import annotations

import contextlib
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions

FloatArray = npt.NDArray[np.float32]


class AddedCells:
    def __init__(self, quantizer: Any, cells: int, nprobe: int, rows: int) -> None:
        self._quantizer = quantizer
        self._nprobe = max(1, min(nprobe, cells))
        # One slot past the last cell, never probed: the cell of a position not filed (-1).
        self._cells = cells
        self.cell = np.full(rows, -1, dtype=np.int64)

    def file(self, positions: Positions, vectors: FloatArray) -> None:
        """File `positions` (each with its row of `vectors`) under their nearest cell."""
        if len(positions):
            _, nearest = self._quantizer.search(np.ascontiguousarray(vectors, np.float32), 1)
            self.cell[positions] = nearest[:, 0]

    def probed(self, vector: FloatArray, start: int, stop: int) -> Positions:
        """The positions in [start, stop) filed under the cells `vector` probes."""
        _, nearest = self._quantizer.search(
            np.ascontiguousarray(vector, np.float32).reshape(1, -1), self._nprobe
        )
        wanted = np.zeros(self._cells + 1, dtype=bool)
        wanted[nearest[0][nearest[0] >= 0]] = True
        found: Positions = np.flatnonzero(wanted[self.cell[start:stop]]) + start
        return found


def added_cells(index: Any, rows: int) -> AddedCells | None:
    """The filing for a world's index, or None where it has no coarse cells."""
    with contextlib.suppress(RuntimeError):
        ivf = faiss.extract_index_ivf(index)
        owned = faiss.clone_index(ivf.quantizer)
        return AddedCells(owned, int(ivf.nlist), int(ivf.nprobe), rows)
    return None
