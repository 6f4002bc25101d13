"""The ground floor: names for the arrays every layer passes around. Imports nothing above it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Positions = npt.NDArray[np.int64]  # catalog positions of items, in the order of the stage
Indices = npt.NDArray[np.intp]  # indices into a stage's own arrays
Scores = npt.NDArray[np.float32]
