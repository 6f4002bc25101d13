"""How well scores order what users did, and how sure a mean over users is: the measures the
build's reports, the live evaluation and the model checks share."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# Resamples of the judged users behind a mean's interval: its bounds move by about 0.001
# between seeds, well inside the interval's own width.
INTERVAL_DRAWS = 1000
# The most user indices drawn at once (32 MiB of them): a million users' interval holds that,
# not 1,000 times their count.
DRAWN_AT_ONCE = 1 << 22


def auc(labels: npt.NDArray[np.int8], scores: npt.NDArray[np.floating]) -> float:
    """The area under the ROC curve: the chance a positive outscores a negative."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def bootstrap_interval(values: list[float], seed: int) -> list[float] | None:
    """The 2.5th and 97.5th percentiles of the mean of `values` (one per judged user) over
    INTERVAL_DRAWS resamples of the users, drawn with replacement from `seed`: how far the
    mean could move with another set of users alike, its sampling noise alone. None below
    two users."""
    if len(values) < 2:
        return None
    per_user = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(INTERVAL_DRAWS)
    block = max(1, DRAWN_AT_ONCE // len(per_user))
    for start in range(0, INTERVAL_DRAWS, block):
        rows = min(block, INTERVAL_DRAWS - start)
        drawn = rng.integers(0, len(per_user), (rows, len(per_user)))
        means[start : start + rows] = per_user[drawn].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return [round(float(low), 4), round(float(high), 4)]
