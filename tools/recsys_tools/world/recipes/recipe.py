"""What a build from a log is asked for, and the clock its steps are timed by."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from recsys_tools.world.learn.factorize import REGULARIZATION
from recsys_tools.world.learn.neighbours import COSINE, NeighbourModel
from recsys_tools.world.learn.ranker.from_log import ListTraining
from recsys_tools.world.read.items import ItemColumns
from recsys_tools.world.read.log import LogColumns


@dataclass(frozen=True, slots=True)
class WorldRecipe:
    interactions: Path
    columns: LogColumns = field(default_factory=LogColumns)
    items: Path | None = None
    item_columns: ItemColumns = field(default_factory=ItemColumns)
    keep_holdout: bool = False
    holdout_share: float = 0.2
    seed: int = 7
    index_factory: str = "auto"
    network: str = "auto"  # a key of learn/ranker/net.NETWORKS
    # Whether the item table's categories and publish times feed the features: auto keeps
    # them where the evaluation says they do not lower the ranked list's NDCG@10.
    item_features: str = "auto"
    # Also evaluate without each of FEATURE_GROUPS: one more training apiece.
    compare_inputs: bool = False
    # What this build leaves out: FEATURE_GROUPS the ranker never sees, and ITEM_TABLE.
    without: frozenset[str] = frozenset()
    # ALS's regularisation; None: chosen on the log's own split (regularization.py).
    regularization: float | None = None
    # How the item-to-item neighbours are scored (learn/neighbours.py).
    neighbours: NeighbourModel = COSINE
    # Learn the order model (learn/order.py) and add its signal to the schema's sequence.
    order_model: bool = False

    @property
    def als_regularization(self) -> float:
        """ALS's regularisation: the one asked for or chosen on the split, else the default."""
        return REGULARIZATION if self.regularization is None else self.regularization

    def training(self) -> ListTraining:
        return ListTraining(self.holdout_share, self.seed, self.network, self.without)


@dataclass(slots=True)
class Clock:
    """Seconds per step, for the report and the progress log."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def took(self, name: str) -> str:
        return f"({self.seconds[name]:.1f} s)"
