"""The checks score models on the CPU, so they run on any host, GPU or not.

One thread each: a check must not compete for cores with whatever else the host serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float32]


def _session(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # a check, not a benchmark: leave the cores alone
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def scores(model: Any, rows: FloatArray) -> FloatArray:
    import numpy as np

    session = _session(model)
    (out,) = session.run([session.get_outputs()[0].name], {session.get_inputs()[0].name: rows})
    flat: FloatArray = np.asarray(out, dtype=np.float32).reshape(-1)
    return flat
