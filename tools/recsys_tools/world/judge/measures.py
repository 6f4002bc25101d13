"""How well scores order what users did: the measures the build's reports and the model
checks share."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Draws of the judged users for a figure's interval: the middle 95% of 1,000 means moves by
# about 0.001 between seeds, well inside the interval's own width.
INTERVAL_DRAWS = 1000


def auc(labels: npt.NDArray[np.int8], scores: npt.NDArray[np.floating]) -> float:
    """The area under the ROC curve: the chance a positive outscores a negative."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def interval(values: list[float], seed: int) -> list[float] | None:
    """The middle 95% of the mean over draws (with replacement) of as many judged users: how
    far the figure could move with another set of users alike, its sampling noise alone.
    None below two users."""
    if len(values) < 2:
        return None
    per_user = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(seed).integers(0, len(per_user), (INTERVAL_DRAWS, len(per_user)))
    low, high = np.quantile(per_user[draws].mean(axis=1), [0.025, 0.975])
    return [round(float(low), 4), round(float(high), 4)]
