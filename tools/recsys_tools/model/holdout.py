"""The world's labelled held-out rows: what every comparison and calibration of the model reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import ConfigError
from app.world.layout import HOLDOUT_FILE

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from app.world.schema import FeatureSchema

    FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Holdout:
    rows: FloatArray
    labels: npt.NDArray[np.int8]
    source: str


def load_holdout(world: Path, schema: FeatureSchema) -> Holdout:
    """The held-out rows the world's build saved (every build does: the demo's test
    impressions, a log's held-out lists)."""
    import numpy as np

    path = world / HOLDOUT_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path} is missing: rebuild the world (recsys build-world, or build-demo), which "
            "saves the rows its model never learnt from"
        )
    with np.load(path) as saved:
        rows, labels = saved["rows"].astype(np.float32), saved["labels"].astype(np.int8)
    if rows.ndim != 2 or rows.shape[1] != schema.width or len(labels) != len(rows):
        raise ConfigError(
            f"{path} holds rows {rows.shape} and labels {labels.shape}, the schema packs "
            f"(n, {schema.width}): rebuild the world"
        )
    return Holdout(rows, labels, str(path))
