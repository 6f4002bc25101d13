"""INT8 ranges must come from rows like the ones served, or the engine clips real traffic.

They are taken from the world's held-out rows, packed as the service packs them and fed in
the chunks it sends. onnxruntime's TensorRT provider reads a calibration table; trtexec
cannot calibrate from data, so a plan is built from a copy with the scales in its graph.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import ConfigError
from recsys_tools.model.engine.scoring import scores
from recsys_tools.world.judge.measures import auc

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from recsys_tools.model.engine.profile import Profile
    from recsys_tools.model.holdout import Holdout

    FloatArray = npt.NDArray[np.float32]

CALIBRATION_ROWS = 4096


class _Batches:
    """Rows in the chunks the service sends, in the form onnxruntime's calibrators read."""

    def __init__(self, input_name: str, rows: FloatArray, batch: int) -> None:
        self._feeds = [{input_name: rows[i : i + batch]} for i in range(0, len(rows), batch)]

    def get_next(self) -> dict[str, FloatArray] | None:
        return self._feeds.pop(0) if self._feeds else None


def calibration_rows(holdout: Holdout, count: int) -> FloatArray:
    """The first `count` held-out rows, packed as the service packs them."""
    import numpy as np

    rows = np.ascontiguousarray(holdout.rows[:count], dtype=np.float32)
    if not len(rows) or not np.isfinite(rows).all():
        raise ConfigError(
            f"{holdout.source}: no rows, or rows with NaN or infinity: rebuild the world"
        )
    return rows


def write_calibration_table(
    model_path: Path, rows: FloatArray, profile: Profile, target: Path
) -> dict[str, float]:
    """onnxruntime's calibration table, which its TensorRT provider reads, as `target`.

    Symmetric min-max ranges: TensorRT quantizes symmetrically, and the table keeps one
    magnitude per tensor. Returns those magnitudes by tensor name.
    """
    import numpy as np
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization import write_calibration_table as write_table

    with tempfile.TemporaryDirectory() as scratch:
        calibrator = create_calibrator(
            model_path,
            augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=CalibrationMethod.MinMax,
            providers=["CPUExecutionProvider"],
            extra_options={"symmetric": True},
        )
        calibrator.collect_data(_Batches(profile.input_name, rows, profile.opt_rows))
        ranges = calibrator.compute_data()
        write_table(ranges, dir=scratch)
        shutil.move(Path(scratch) / "calibration.flatbuffers", target)
    return {
        str(name): float(np.max(np.abs([data.lowest, data.highest])))
        for name, data in ranges.items()
    }


def check_table(magnitudes: dict[str, float], input_name: str) -> str:
    import math

    if input_name not in magnitudes or not all(
        math.isfinite(v) and v > 0 for v in magnitudes.values()
    ):
        raise ConfigError(
            f"the INT8 calibration misses {input_name!r} or holds zero or non-finite ranges: "
            "use more --calibration-rows, or check the held-out rows"
        )
    return (
        f"calibration table: {len(magnitudes)} tensors, {input_name!r} within "
        f"±{magnitudes[input_name]:g}"
    )


def write_qdq_model(source: Path, rows: FloatArray, profile: Profile, target: Path) -> None:
    """An explicitly quantized copy (QuantizeLinear/DequantizeLinear around each MatMul).

    trtexec cannot calibrate from data (its --calib only reads a cache), and TensorRT takes
    the scales from the Q/DQ nodes: symmetric INT8, zero points 0, as TensorRT requires.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    # It advises a pre-processing pass, which this exported MLP does not need: hush it.
    logging.disable(logging.WARNING)
    try:
        quantize_static(
            source,
            target,
            _Batches(profile.input_name, rows, profile.opt_rows),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
    finally:
        logging.disable(logging.NOTSET)


def qdq_drift(holdout: Holdout, fp32: Path, qdq: Path, used: int) -> str:
    """How far the INT8 copy moves on held-out rows it was not calibrated on (CPU)."""
    import numpy as np

    rows, labels = holdout.rows[used:], holdout.labels[used:]
    if len(np.unique(labels)) < 2:
        rows, labels, used = holdout.rows, holdout.labels, 0
    base, reduced = scores(str(fp32), rows), scores(str(qdq), rows)
    diff = float(np.abs(base - reduced).max())
    aucs = ""
    if len(np.unique(labels)) == 2:
        aucs = f", AUC {auc(labels, base):.4f} -> {auc(labels, reduced):.4f}"
    unseen = "not used for calibration" if used else "(all of them: too few others)"
    return (
        f"INT8 Q/DQ copy on the CPU over {len(rows)} held-out rows {unseen}: max |score diff| "
        f"{diff:.4f}{aucs}; TensorRT's kernels differ a little, so compare again on the GPU"
    )
