"""The ranking network: cross layers over the packed row, a deep tower, two heads.

    x0 = (row - mean) / scale
    x_{l+1} = x0 * (x_l W_l + b_l) + x_l          (DCN-v2 cross layers, full rank)
    h = relu(... relu(x_L A_1 + c_1) ...)          (the deep tower, on the cross output)
    p_interact = sigmoid(h u + d),  p_like = sigmoid(h v + e)
    score = (h u + d) + log((1 - w) + w * p_like)

The interact head learns a positive against sampled negatives; the like head learns, on
positives only, which of them the user rated highly (or, in a generated world, liked), so
its probability reads as P(like | interaction). The score is a log-odds: the interact
head's own, with the odds multiplied by what the item is worth when a like is worth 1 and
a plain interaction 1 - w. It is never put through a sigmoid: a sigmoid saturates (at 1.0
in float32 from a log-odds of about 17, in FP16 from about 8), and every candidate past
that point would tie. The heads answer probabilities.

The cross layers let the sequence block (how near the candidate is to what the user just
did) multiply the rest of the row, the interaction a plain MLP has to approximate. Both are
kept here as shapes of one network (cross_layers 0 is the plain MLP) so the build can
measure one against the other on the same rows.

PyTorch trains (fit.py); the export (export.py) writes the ONNX graph from the learnt weights
directly, with no exporter between the weights and the served file. Serving never imports
torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.world.schema import HEAD_NAMES

FloatArray = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int8]
# What a like is worth against a plain interaction in the combined score.
LIKE_WEIGHT = 0.5
# The heads' names, in the order of the network's two logits: the served contract's.
HEADS = HEAD_NAMES
# The least the like value's log is taken of: with a like weight of 1 and a like head that
# answers 0, the score falls far, not to -inf.
LIKE_FLOOR = 1e-7


@dataclass(frozen=True, slots=True)
class NetShape:
    cross_layers: int = 2
    deep: tuple[int, ...] = (64, 32)
    like_weight: float = LIKE_WEIGHT
    epochs: int = 30
    patience: int = 3
    batch: int = 512
    learning_rate: float = 2e-3
    weight_decay: float = 1e-5

    @property
    def kind(self) -> str:
        return "dcn" if self.cross_layers else "mlp"


DCN = NetShape()
MLP = NetShape(cross_layers=0)
# "auto" trains each and keeps the better (fit_best).
NETWORKS = {"dcn": (DCN,), "mlp": (MLP,), "auto": (MLP, DCN)}


@dataclass(frozen=True, slots=True)
class Layer:
    weight: FloatArray  # [inputs, outputs]
    bias: FloatArray  # [outputs]


@dataclass(frozen=True, slots=True)
class RankerNet:
    """The learnt weights, in numpy: what the export writes and what scores rows offline."""

    shape: NetShape
    mean: FloatArray
    scale: FloatArray
    cross: tuple[Layer, ...]
    deep: tuple[Layer, ...]
    heads: Layer  # [hidden, 2]: the interact and like logits
    epochs_run: int = 0
    validation_loss: float = math.inf
    # Each shape trained on the same rows (its kind: validation loss), where fit_best chose.
    considered: dict[str, float] = field(default_factory=dict)

    def head_probabilities(self, rows: FloatArray) -> npt.NDArray[np.float64]:
        """[n, 2]: P(interact) and P(like | interaction) for each row."""
        probabilities: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-self.logits(rows)))
        return probabilities

    def logits(self, rows: FloatArray) -> npt.NDArray[np.float64]:
        """[n, 2]: each head's log-odds."""
        x0 = (rows.astype(np.float64) - self.mean) / self.scale
        x = x0
        for layer in self.cross:
            x = x0 * (x @ layer.weight + layer.bias) + x
        for layer in self.deep:
            x = np.maximum(x @ layer.weight + layer.bias, 0.0)
        logits: npt.NDArray[np.float64] = x @ self.heads.weight + self.heads.bias
        return logits

    def scores(self, rows: FloatArray) -> npt.NDArray[np.float64]:
        """The combined score the exported graph serves: a log-odds."""
        logits = self.logits(rows)
        w = self.shape.like_weight
        like = 1.0 / (1.0 + np.exp(-logits[:, 1]))
        combined: npt.NDArray[np.float64] = logits[:, 0] + np.log(
            np.maximum((1 - w) + w * like, LIKE_FLOOR)
        )
        return combined

    @property
    def flops_per_row(self) -> int:
        """Multiply-adds of one row, each counted as two operations."""
        layers = (*self.cross, *self.deep, self.heads)
        return sum(2 * layer.weight.size for layer in layers)
