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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError
from app.world.layout import PRERANK_FILE

FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True, slots=True)
class PrerankWeights:
    user: float = 1.0
    similar: float = 0.0
    recent: float = 0.0
    order: float = 0.0


def save_prerank(world: Path, weights: PrerankWeights) -> None:
    (world / PRERANK_FILE).write_text(json.dumps(asdict(weights), indent=2) + "\n")


def _weight(raw: object, name: str) -> float:
    """A weight as JSON gives it: a number, never a bool or a string that parses as one."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TypeError(f"{name} is {type(raw).__name__}, not a number")
    return float(raw)


def load_prerank(world: Path) -> PrerankWeights:
    path = world / PRERANK_FILE
    if not path.is_file():
        return PrerankWeights()
    try:
        raw = json.loads(path.read_text())
        weights = PrerankWeights(
            **{name: _weight(raw[name], name) for name in ("user", "similar", "recent")},
            order=_weight(raw.get("order", 0.0), "order"),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc
    # Pre-rank multiplies in float32: a weight past its range is Inf there, and 0 x Inf (a
    # signal a world lacks) NaN for every candidate.
    if not all(abs(value) < FLOAT32_MAX for value in asdict(weights).values()):
        raise ConfigError(f"{path} holds NaN, Inf or a value past float32's: rebuild the world")
    return weights
