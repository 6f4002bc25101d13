"""The build's report: what was read and served, how the world judged, what was learnt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE
from app.world.neighbours import Neighbours
from app.world.tables import SeenLists
from recsys_tools.world.learn.neighbours import COSINE, EASE_LAMBDA, EASE_MAX_ITEMS, NeighbourModel
from recsys_tools.world.read.log import InteractionLog


def counts(whole: InteractionLog, served: InteractionLog, users: int) -> dict[str, Any]:
    rows_per_item = np.bincount(whole.item, minlength=whole.n_items)
    positives_per_item = np.bincount(whole.item[whole.positive], minlength=whole.n_items)
    return {
        "rows_read": whole.counts.rows_read,
        "interactions": len(whole.user),
        "positives": int(whole.positive.sum()),
        "below_min_weight": whole.counts.below_min_weight,
        "dropped": dict(whole.counts.dropped),
        "users": users,
        "items": whole.n_items,
        "items_without_interactions": int((rows_per_item == 0).sum()),
        "items_without_positives": int((positives_per_item == 0).sum()),
        "categories": len(whole.items.category_names),
        "served_positives": int(served.positive.sum()),
    }


def histories(seen: SeenLists) -> dict[str, int]:
    """How many histories there are and the longest: the service filters each one whole."""
    lengths = np.diff(seen.offsets)
    return {"users": len(lengths), "longest": int(lengths.max()) if len(lengths) else 0}


def neighbours_report(
    model: NeighbourModel, served: Neighbours, page: Neighbours | None
) -> dict[str, Any]:
    """The model and how many items the served world gives neighbours: with EASE, past
    `max_items` the items fewer users chose have none; and, where the world keeps a list of
    its own for item pages, that it is cosine's."""
    with_neighbours = int((served.positions[:, 0] >= 0).sum()) if served.k else 0
    if model.kind == "cosine":
        return {"model": "cosine", "items_with_neighbours": with_neighbours}
    return {
        "model": model.kind,
        "lambda": model.lam,
        "max_items": model.max_items,
        "items_with_neighbours": with_neighbours,
    } | ({} if page is None else {"page": "cosine"})


def read_report(world: Path) -> dict[str, Any] | None:
    """The build's report.json; None where the world has none (not built by build-world),
    ConfigError naming the file where it is not a JSON object."""
    path = world / REPORT_FILE
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path} is not the build's JSON report: {exc}"[:300]) from None
    if not isinstance(report, dict):
        raise ConfigError(f"{path} is not the build's JSON report: not an object")
    return report


def built_neighbours(world: Path) -> NeighbourModel:
    """The neighbour model a world's report says it was built with (a retrain keeps it);
    cosine where the report says none (a world built before the choice existed)."""
    path = world / REPORT_FILE
    said = (read_report(world) or {}).get("neighbours")
    if not isinstance(said, dict) or said.get("model") != "ease":
        return COSINE
    try:
        lam = float(said.get("lambda", EASE_LAMBDA))
        most = said.get("max_items", EASE_MAX_ITEMS)
        if isinstance(most, float) and most.is_integer():
            most = int(most)  # 10000.0: a hand's edit, the same count
        return NeighbourModel("ease", lam, most)
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"{path}: neighbours {said!r:.120} ({exc})") from None
