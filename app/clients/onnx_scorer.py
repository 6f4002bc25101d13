"""The ranking model's ONNX file run by onnxruntime on the CPU: rows in, one score a row.

The one way this project scores outside Triton: the service's in-process fallback, the
build's evaluation, `recsys model compare` and the engine checks. onnxruntime is imported
when a scorer is made: the serving install has it only with the `fallback` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError


class MissingOnnxRuntimeError(ConfigError):
    """onnxruntime is not installed here."""


class OnnxScorer:
    """A loaded model: `score` runs one batch of rows in the calling thread."""

    def __init__(self, session: Any) -> None:
        self._session = session
        model_input = session.get_inputs()[0]
        self._input = model_input.name
        self._output = [session.get_outputs()[0].name]
        self.input_shape: list[Any] = list(model_input.shape or [])

    def score(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        (scores,) = self._session.run(self._output, {self._input: rows})
        flat: npt.NDArray[np.float32] = np.asarray(scores, dtype=np.float32).reshape(-1)
        return flat


def onnx_scorer(model: Path | bytes, threads: int = 1) -> OnnxScorer:
    """The model (a file, or its bytes) loaded on the CPU with `threads` threads for one
    run: one leaves the other cores to whatever else the host serves. ConfigError when
    onnxruntime is missing or the model does not load."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingOnnxRuntimeError(
            "scoring the model in process needs onnxruntime: install it (the server's "
            "`fallback` extra, or the operator's tools, which require it)"
        ) from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: a model's load notes are nobody's to act on
    source = str(model) if isinstance(model, Path) else model
    named = model if isinstance(model, Path) else "the model"
    try:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's load errors share no narrower base
        raise ConfigError(f"{named} does not load in onnxruntime ({exc})") from None
    return OnnxScorer(session)
