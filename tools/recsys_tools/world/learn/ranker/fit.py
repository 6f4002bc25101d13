"""Training the ranking network with PyTorch (imported only here, and only when training).

The network's parameters are the layers of net.py's shape; what is learnt goes back to numpy
as a RankerNet, which scores offline and is what the export writes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from recsys_tools.world.learn.early_stop import BestEpoch
from recsys_tools.world.learn.ranker.net import (
    DCN,
    HEADS,
    FloatArray,
    Labels,
    Layer,
    NetShape,
    RankerNet,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

# The share of training rows kept back to decide when to stop.
VALIDATION = 0.1


@dataclass(frozen=True, slots=True)
class _Layers:
    cross: list[nn.Linear]
    deep: list[nn.Linear]
    heads: nn.Linear

    @classmethod
    def of(cls, width: int, shape: NetShape) -> _Layers:
        from torch import nn

        cross = [nn.Linear(width, width) for _ in range(shape.cross_layers)]
        for linear in cross:
            # Each cross layer starts near the identity map x0 * 0 + x: the network begins as
            # its deep tower alone and the crossing grows only where it lowers the loss.
            nn.init.normal_(linear.weight, std=0.01)
            nn.init.zeros_(linear.bias)
        sizes = (width, *shape.deep)
        deep = [nn.Linear(a, b) for a, b in itertools.pairwise(sizes)]
        return cls(cross, deep, nn.Linear(sizes[-1], len(HEADS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        x0, h = x, x
        for layer in self.cross:
            h = x0 * layer(h) + h
        for layer in self.deep:
            h = torch.relu(layer(h))
        logits: torch.Tensor = self.heads(h)
        return logits

    def parameters(self) -> list[nn.Parameter]:
        return [p for module in (*self.cross, *self.deep, self.heads) for p in module.parameters()]


@dataclass(frozen=True, slots=True)
class _Loss:
    """Both heads' loss over rows by index: interact on every row, like where interacted."""

    layers: _Layers
    x: torch.Tensor
    interact: torch.Tensor
    like_known: torch.Tensor
    like: torch.Tensor

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        from torch import nn

        loss_fn = nn.BCEWithLogitsLoss(reduction="none")
        logits = self.layers.forward(self.x[idx])
        interact: torch.Tensor = loss_fn(logits[:, 0], self.interact[idx]).mean()
        known = self.like_known[idx]
        if not bool(known.any()):
            return interact
        like: torch.Tensor = loss_fn(logits[known, 1], self.like[idx][known]).mean()
        return interact + like


def _standardised(
    rows: FloatArray, ignored: npt.NDArray[np.bool_] | None
) -> tuple[FloatArray, FloatArray]:
    """Each column's mean and scale; an ignored column's scale is infinite, so it reads 0."""
    mean = rows.mean(axis=0, dtype=np.float64).astype(np.float32)
    scale = rows.std(axis=0, dtype=np.float64).astype(np.float32)
    scale[scale < 1e-6] = 1.0
    if ignored is not None:
        scale[ignored] = np.inf
    return mean, scale


def _loss(layers: _Layers, x: FloatArray, interacted: Labels, liked: Labels | None) -> _Loss:
    import torch

    return _Loss(
        layers,
        torch.from_numpy(x),
        torch.from_numpy(interacted.astype(np.float32)),
        torch.from_numpy((interacted == 1) if liked is not None else np.zeros(len(x), dtype=bool)),
        torch.from_numpy(
            liked.astype(np.float32) if liked is not None else np.zeros(len(x), np.float32)
        ),
    )


def _train(
    loss_of: _Loss, shape: NetShape, rows: int, rng: np.random.Generator
) -> tuple[int, float]:
    """Epochs over the learning rows until the checking rows' loss stops falling; the best
    parameters are restored. Returns the epochs run and the best checking loss."""
    import torch

    parameters = loss_of.layers.parameters()
    optimiser = torch.optim.Adam(
        parameters, lr=shape.learning_rate, weight_decay=shape.weight_decay
    )
    order = rng.permutation(rows)
    n_check = max(1, math.ceil(VALIDATION * rows))
    check_idx, learn = torch.from_numpy(order[:n_check]), order[n_check:]
    kept, epochs = BestEpoch(parameters, shape.patience, _lower, math.inf), 0
    for epoch in range(shape.epochs):
        epochs = epoch + 1
        shuffled = torch.from_numpy(rng.permutation(learn))
        for start in range(0, len(shuffled), shape.batch):
            optimiser.zero_grad()
            loss = loss_of(shuffled[start : start + shape.batch])
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
        with torch.no_grad():
            checked = float(loss_of(check_idx))
        if kept.offer(checked):
            break
    kept.restore()
    return epochs, kept.best


def _lower(loss: float, best: float) -> bool:
    return loss < best - 1e-4


def _as_layer(module: nn.Linear) -> Layer:
    return Layer(
        module.weight.detach().numpy().T.astype(np.float32).copy(),
        module.bias.detach().numpy().astype(np.float32).copy(),
    )


def fit_net(
    rows: FloatArray,
    interacted: Labels,
    liked: Labels | None = None,
    shape: NetShape = DCN,
    seed: int = 7,
    ignored: npt.NDArray[np.bool_] | None = None,
) -> RankerNet:
    """Train on packed rows: `interacted` for every row, `liked` read where interacted is 1
    (None: no like signal; the like head learns nothing and the score is P(interact)).

    `ignored` columns are scaled by 0 as the row is standardised, in training and in the
    graph: the network never sees them (how the build measures what a feature group buys)."""
    import torch

    if liked is None:
        shape = replace(shape, like_weight=0.0)  # the score is P(interact) alone
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    mean, scale = _standardised(rows, ignored)
    layers = _Layers.of(rows.shape[1], shape)
    loss_of = _loss(layers, (rows - mean) / scale, interacted, liked)
    epochs, best = _train(loss_of, shape, len(rows), rng)
    return RankerNet(
        shape,
        mean,
        scale,
        tuple(_as_layer(m) for m in layers.cross),
        tuple(_as_layer(m) for m in layers.deep),
        _as_layer(layers.heads),
        epochs_run=epochs,
        validation_loss=round(best, 5),
    )


def fit_best(
    rows: FloatArray,
    interacted: Labels,
    liked: Labels | None,
    shapes: tuple[NetShape, ...],
    seed: int = 7,
    check: tuple[FloatArray, Labels] | None = None,
    ignored: npt.NDArray[np.bool_] | None = None,
) -> RankerNet:
    """Each shape trained on the same rows; the one kept is the one whose score tells the
    `check` rows' positives best (AUC; rows of users none of them learnt from), else the
    one with the lowest validation loss. `considered` holds every shape's figure.

    Measured on the sessions log: the cross layers reached the lower validation loss (rows
    of the users they learnt from, whose embeddings they can memorise crosses of) and the
    lower AUC on other users (0.846 against 0.860), so users apart decide where given."""
    from sklearn.metrics import roc_auc_score

    nets = [fit_net(rows, interacted, liked, shape, seed, ignored) for shape in shapes]
    if check is not None and 0 < check[1].sum() < len(check[1]) and len(nets) > 1:
        figures = [round(float(roc_auc_score(check[1], net.scores(check[0]))), 5) for net in nets]
        chosen = nets[int(np.argmax(figures))]
    else:
        figures = [net.validation_loss for net in nets]
        chosen = min(nets, key=lambda net: net.validation_loss)
    considered = {net.shape.kind: figure for net, figure in zip(nets, figures, strict=True)}
    return replace(chosen, considered=considered)
