"""The artifacts a request reads, held behind one reference so they can be swapped whole."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.catalog import Catalog
from app.rules import RerankRules
from app.schema import FeatureSchema, ModelSignature


@dataclass(frozen=True, slots=True)
class ServingArtifacts:
    schema: FeatureSchema
    catalog: Catalog
    rules: RerankRules
    model: ModelSignature
    item_keys: npt.NDArray[np.bytes_]  # the Redis key of each catalog item, by position


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
