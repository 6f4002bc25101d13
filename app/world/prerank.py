"""The pre-rank score's weights, as the world build fitted them.

prerank.json holds one weight per signal the pre-rank stage computes in process for every
pooled candidate (app.pipeline.stages.prerank): `user`, the user's vector against the item's
(the ANN score); `similar`, the item-to-item score from the neighbours of the user's latest
positives; `recent`, the item's vector against the mean of those positives' vectors; `order`,
the order model's score (app.world.order), absent (0) from a world built before it. A world
without the file pre-ranks by the user's vector alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from app.core.errors import ConfigError
from app.world.layout import PRERANK_FILE


@dataclass(frozen=True, slots=True)
class PrerankWeights:
    user: float = 1.0
    similar: float = 0.0
    recent: float = 0.0
    order: float = 0.0


def save_prerank(world: Path, weights: PrerankWeights) -> None:
    (world / PRERANK_FILE).write_text(json.dumps(asdict(weights), indent=2) + "\n")


def load_prerank(world: Path) -> PrerankWeights:
    path = world / PRERANK_FILE
    if not path.is_file():
        return PrerankWeights()
    try:
        raw = json.loads(path.read_text())
        weights = PrerankWeights(
            **{name: float(raw[name]) for name in ("user", "similar", "recent")},
            order=float(raw.get("order", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc
    if not all(math.isfinite(value) for value in asdict(weights).values()):
        raise ConfigError(f"{path} holds NaN or Inf: rebuild the world")
    return weights
