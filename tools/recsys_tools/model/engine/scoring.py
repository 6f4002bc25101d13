"""The checks score models on the CPU, so they run on any host, GPU or not.

One thread each: a check must not compete for cores with whatever else the host serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float32]


def scores(model: Any, rows: FloatArray) -> FloatArray:
    """The model's scores of `rows`: a model file's path, or an onnx ModelProto."""
    from pathlib import Path

    from app.clients.onnx_scorer import onnx_scorer

    source = Path(model) if isinstance(model, str) else model.SerializeToString()
    # A check, not a benchmark: one thread leaves the cores alone.
    return onnx_scorer(source, threads=1).score(rows)
