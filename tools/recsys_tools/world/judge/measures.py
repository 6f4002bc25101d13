"""How well scores order what users did: the measures the build's reports and the model
checks share."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def auc(labels: npt.NDArray[np.int8], scores: npt.NDArray[np.floating]) -> float:
    """The area under the ROC curve: the chance a positive outscores a negative."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))
