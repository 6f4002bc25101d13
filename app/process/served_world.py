"""What one world's answers are made from and kept current by, apart from the service that
holds it (app.process.services.Services: its settings, metrics, clients and lifecycle)."""

from __future__ import annotations

from dataclasses import dataclass

from app.clients.catalog_log import CatalogLog
from app.clients.exposure import Exposure
from app.clients.item_memory import ItemMemory
from app.clients.trending import TrendingItems
from app.pipeline.recommend import RecommendPipeline
from app.process.catalog_follower import CatalogFollower
from app.process.reload import Reloader
from app.release.artifacts import ArtifactsRef
from app.world.stamp import WorldStamp


@dataclass(slots=True)
class ServedWorld:
    """The world's stamp, the artifacts answers are made from and the pipeline that makes
    them, what swaps its model (the reloader), and what keeps it current while serving: the
    trending items and, with room in the catalog, its changes and the added items' exposure;
    its item features when held in memory. Its Services holds the rest of the world's
    service: settings, metrics, the Redis and Triton clients behind their breakers, the logs
    it writes, and what closes at shutdown."""

    stamp: WorldStamp | None
    artifacts: ArtifactsRef
    pipeline: RecommendPipeline
    reloader: Reloader
    trending: TrendingItems
    item_memory: ItemMemory | None = None
    # Items put and withdrawn while serving (app.process.catalog_follower); None without room.
    catalog_log: CatalogLog | None = None
    catalog_follower: CatalogFollower | None = None
    # The showings and positives of items added while serving, for exploration.
    exposure: Exposure | None = None

    @property
    def world_id(self) -> str:
        """The stamp's id; empty for a world built without one (served unchecked)."""
        return self.stamp.world_id if self.stamp is not None else ""
