"""The artifacts a request reads, held behind one reference so they can be swapped whole."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.core.membership import lookup, positions_of
from app.core.vocabulary import Positions
from app.release.catalog import Catalog
from app.release.keyspace import KeySpace
from app.release.pages import Page, page_named, resolve_pages
from app.release.plan import ModelRouting
from app.release.rules import RerankRules
from app.world.schema import FeatureSchema, ModelSignature


@dataclass(frozen=True, slots=True)
class ServingArtifacts:
    """What a request reads. Build with `serving_artifacts`, which derives the rest.

    `label` names the world's files and the rules together: two answers with one label were
    made from the same index, catalog and rules, in any worker.
    """

    schema: FeatureSchema
    catalog: Catalog
    rules: RerankRules
    routing: ModelRouting
    label: str
    item_keys: npt.NDArray[np.bytes_]  # the Redis key of each catalog item, by position
    blocked: npt.NDArray[np.bool_]  # by position: the rules' block list
    popular: npt.NDArray[np.int64]  # unblocked positions, most popular first
    id_order: npt.NDArray[np.intp]  # sorts catalog.item_ids: ids to positions by binary search
    item_key_prefix: bytes  # an item's key is this and its id
    pages: dict[str, Page]  # every schema page, its rules resolved

    def page(self, name: str) -> Page:
        """The page a request names (`other` where the schema lacks it), resolved."""
        return page_named(self.pages, name)

    @property
    def model(self) -> ModelSignature:
        """The stable version's signature: what the schema was checked against."""
        return self.routing.stable.signature

    def positions_of(self, ids: Collection[str]) -> Positions:
        """The positions of those of `ids` that the catalog has, in no particular order."""
        room = self.catalog.room
        if room is None or not room.positions:
            return positions_of(self.catalog.item_ids, self.id_order, list(ids))
        found = self.lookup(list(ids))
        return found[found >= 0]

    def lookup(self, ids: list[str]) -> Positions:
        """The position of each of `ids`, in order; -1 where the catalog lacks it."""
        found = lookup(self.catalog.item_ids, self.id_order, ids)
        room = self.catalog.room
        return found if room is None else room.known(found, ids, self.catalog.size)

    def keys_at(self, positions: Positions) -> list[bytes]:
        """The Redis keys of the items at `positions`."""
        base = len(self.item_keys)
        room = self.catalog.room
        if room is None or len(positions) == 0 or int(positions.max()) < base:
            keys: list[bytes] = self.item_keys[positions].tolist()
            return keys
        ids: list[str] = self.catalog.ids_at(positions).tolist()
        return [self.item_key_prefix + item_id.encode() for item_id in ids]

    @property
    def withdrawn(self) -> npt.NDArray[np.bool_] | None:
        """By position, the items withdrawn while serving; None while there are none."""
        room = self.catalog.room
        return None if room is None or not room.withdrawals else room.withdrawn


def artifacts_label(world_files: str, rules: RerankRules) -> str:
    """A short digest of what identifies the world's files, and of the rules as parsed."""
    rules_json = rules.model_dump(mode="json")
    rules_json["block"]["item_ids"] = sorted(rules_json["block"]["item_ids"])
    text = world_files + json.dumps(rules_json, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def serving_artifacts(
    schema: FeatureSchema,
    catalog: Catalog,
    rules: RerankRules,
    routing: ModelRouting,
    keys: KeySpace,
    world_files: str = "",
) -> ServingArtifacts:
    """Resolve, once, what requests would otherwise look up item by item."""
    id_order = np.argsort(catalog.item_ids, kind="stable")
    blocked = np.zeros(catalog.rows, dtype=bool)
    blocked[positions_of(catalog.item_ids, id_order, sorted(rules.block.item_ids))] = True
    popular = catalog.popular_order[~blocked[catalog.popular_order]]
    item_keys = keys.item_keys(catalog.item_ids)
    label = artifacts_label(world_files, rules)
    return ServingArtifacts(
        schema,
        catalog,
        rules,
        routing,
        label,
        item_keys,
        blocked,
        popular,
        id_order,
        keys.item("").encode(),
        resolve_pages(schema, rules),
    )


class ArtifactsRef:
    """Holds the current artifacts; readers take one snapshot per request.

    A swap replaces the reference only: a request that took the previous snapshot keeps it,
    index and all, until it ends, and the old one is freed when the last such request is.
    """

    def __init__(self, initial: ServingArtifacts) -> None:
        self._current = initial
        self.generation = 1

    @property
    def current(self) -> ServingArtifacts:
        return self._current

    def grow(self, replacement: ServingArtifacts) -> None:
        """Install the same release over a catalog its change log grew: no new generation."""
        self._current = replacement

    def swap(self, replacement: ServingArtifacts) -> ServingArtifacts:
        """Install `replacement` (built and checked beforehand) and return what it replaced."""
        previous, self._current = self._current, replacement
        self.generation += 1
        return previous
