"""Set membership on arrays of catalog positions, the way the request path needs it.

np.isin sorts the values and the pool together on every call; sorting only the pool and
binary-searching each value costs about a fifth of that for a thousand candidates.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Positions


def member_mask(values: Positions, pool: Positions) -> npt.NDArray[np.bool_]:
    """For each of `values`, whether it is in `pool`."""
    if len(values) == 0 or len(pool) == 0:
        return np.zeros(len(values), dtype=bool)
    ordered = np.sort(pool)
    at = np.searchsorted(ordered, values)
    np.minimum(at, len(ordered) - 1, out=at)
    return np.asarray(ordered[at] == values)


def positions_of(
    ids: npt.NDArray[np.str_], id_order: npt.NDArray[np.intp], wanted: list[str]
) -> Positions:
    """The catalog positions of the `wanted` ids that the catalog has; `id_order` sorts `ids`."""
    if not wanted or len(ids) == 0:
        return np.empty(0, dtype=np.int64)
    query = np.array(wanted, dtype=np.str_)
    at = np.searchsorted(ids, query, sorter=id_order)
    np.minimum(at, len(ids) - 1, out=at)
    found: Positions = id_order[at].astype(np.int64, copy=False)
    kept: Positions = found[ids[found] == query]
    return kept


def lookup(
    ids: npt.NDArray[np.str_], id_order: npt.NDArray[np.intp], wanted: list[str]
) -> Positions:
    """The catalog position of each of `wanted`, in its order; -1 for an id it lacks."""
    if not wanted or len(ids) == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    query = np.array(wanted, dtype=np.str_)
    at = np.searchsorted(ids, query, sorter=id_order)
    np.minimum(at, len(ids) - 1, out=at)
    found: Positions = id_order[at].astype(np.int64, copy=False)
    result: Positions = np.where(ids[found] == query, found, -1)
    return result
