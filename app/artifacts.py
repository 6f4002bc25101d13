"""The artifacts a request reads, held behind one reference so they can be swapped whole."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.catalog import Catalog
from app.clients.feature_store import KeySpace
from app.membership import positions_of
from app.rules import RerankRules
from app.schema import FeatureSchema, ModelSignature
from app.stages.types import Positions


@dataclass(frozen=True, slots=True)
class ServingArtifacts:
    """What a request reads. Build with `serving_artifacts`, which derives the last four."""

    schema: FeatureSchema
    catalog: Catalog
    rules: RerankRules
    model: ModelSignature
    item_keys: npt.NDArray[np.bytes_]  # the Redis key of each catalog item, by position
    blocked: npt.NDArray[np.bool_]  # by position: the rules' block list
    popular: npt.NDArray[np.int64]  # unblocked positions, most popular first
    id_order: npt.NDArray[np.intp]  # sorts catalog.item_ids: ids to positions by binary search

    def positions_of(self, ids: Collection[str]) -> Positions:
        """The positions of those of `ids` that the catalog has, in no particular order."""
        return positions_of(self.catalog.item_ids, self.id_order, list(ids))


def serving_artifacts(
    schema: FeatureSchema,
    catalog: Catalog,
    rules: RerankRules,
    model: ModelSignature,
    keys: KeySpace,
) -> ServingArtifacts:
    """Resolve, once, what requests would otherwise look up item by item."""
    id_order = np.argsort(catalog.item_ids, kind="stable")
    blocked = np.zeros(catalog.size, dtype=bool)
    blocked[positions_of(catalog.item_ids, id_order, sorted(rules.block.item_ids))] = True
    popular = catalog.popular_order[~blocked[catalog.popular_order]]
    item_keys = keys.item_keys(catalog.item_ids)
    return ServingArtifacts(schema, catalog, rules, model, item_keys, blocked, popular, id_order)


class ArtifactsRef:
    """Holds the current artifacts; readers take one snapshot per request."""

    def __init__(self, initial: ServingArtifacts) -> None:
        self._current = initial

    @property
    def current(self) -> ServingArtifacts:
        return self._current

    def swap(self, replacement: ServingArtifacts) -> ServingArtifacts:
        """Install `replacement` (built and checked beforehand) and return what it replaced."""
        previous, self._current = self._current, replacement
        return previous
