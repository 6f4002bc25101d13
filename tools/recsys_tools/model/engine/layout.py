"""Triton serves every numbered directory under a model as a version of it.

What must stay beside the model without being served (the ONNX a plan is built from, the
calibration set) goes under names that are not numbers.
"""

from __future__ import annotations

VERSION_DIR = "1"
BUILD_DIR = "build"  # not a number: Triton skips it when it lists the model's versions
CALIBRATION_DIR = "calibration"
