"""The world's labelled held-out rows: what every comparison and calibration of the model reads."""

from __future__ import annotations

import zipfile
import zlib
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

# What numpy raises reading an archive that is not the one the build wrote: a truncated or
# foreign zip, a member that is not an array, pickled objects, a header past memory.
_UNREADABLE = (
    OSError,
    EOFError,
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    MemoryError,
    zipfile.BadZipFile,
    zlib.error,
)


@dataclass(frozen=True, slots=True)
class Holdout:
    rows: FloatArray
    labels: npt.NDArray[np.int8]
    source: str


def load_holdout(world: Path, schema: FeatureSchema) -> Holdout:
    """The held-out rows the world's build saved (build-world's held-out lists, build-demo's
    test impressions); ConfigError, naming the file, for any file that is not such rows."""
    import numpy as np

    path = world / HOLDOUT_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path} is missing: rebuild the world (recsys build-world or build-demo save the "
            "rows its model never learnt from; docs/world-format.md says how to write them)"
        )
    try:
        # The file opened here, not by numpy, which leaves it open when the zip is broken.
        with path.open("rb") as file, np.load(file) as saved:
            rows, labels = np.asarray(saved["rows"]), np.asarray(saved["labels"])
    except _UNREADABLE as exc:
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise ConfigError(f"{path} is not held-out rows ({reason}): rebuild the world") from None
    if rows.ndim != 2 or rows.shape[1] != schema.width or labels.shape != (len(rows),):
        raise ConfigError(
            f"{path} holds rows {rows.shape} and labels {labels.shape}, the schema packs "
            f"(n, {schema.width}): rebuild the world"
        )
    if not len(rows) or rows.dtype.kind not in "fiu" or labels.dtype.kind not in "iub":
        raise ConfigError(
            f"{path} holds {len(rows)} rows of {rows.dtype} and labels of {labels.dtype}: "
            "rebuild the world"
        )
    rows = rows.astype(np.float32)
    if not np.isfinite(rows).all() or not np.isin(labels, (0, 1)).all():
        raise ConfigError(f"{path} holds a row not finite or a label not 0 or 1: rebuild the world")
    return Holdout(rows, labels.astype(np.int8), str(path))
