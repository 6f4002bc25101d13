"""The build's report: what was read and served, how the world judged, what was learnt."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.world.tables import SeenLists
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
