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

PyTorch trains; the export writes the ONNX graph from the learnt weights directly (MatMul,
Add, Mul, Relu, Sigmoid, Log), the few operators every Triton backend and TensorRT run, with no
exporter between the weights and the served file. Serving never imports torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from app.release.schema import HEAD_NAMES, HEADS_OUTPUT

FloatArray = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int8]
# The share of training rows kept back to decide when to stop.
VALIDATION = 0.1
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
    from torch import nn

    if liked is None:
        shape = replace(shape, like_weight=0.0)  # the score is P(interact) alone
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    mean = rows.mean(axis=0, dtype=np.float64).astype(np.float32)
    scale = rows.std(axis=0, dtype=np.float64).astype(np.float32)
    scale[scale < 1e-6] = 1.0
    if ignored is not None:
        scale[ignored] = np.inf
    width = rows.shape[1]
    cross = [nn.Linear(width, width) for _ in range(shape.cross_layers)]
    for linear in cross:
        # Each cross layer starts near the identity map x0 * 0 + x: the network begins as
        # its deep tower alone and the crossing grows only where it lowers the loss.
        nn.init.normal_(linear.weight, std=0.01)
        nn.init.zeros_(linear.bias)
    sizes = (width, *shape.deep)
    deep = [nn.Linear(a, b) for a, b in itertools.pairwise(sizes)]
    heads = nn.Linear(sizes[-1], len(HEADS))

    def forward(x: torch.Tensor) -> torch.Tensor:
        x0, h = x, x
        for layer in cross:
            h = x0 * layer(h) + h
        for layer in deep:
            h = torch.relu(layer(h))
        logits: torch.Tensor = heads(h)
        return logits

    parameters = [p for module in (*cross, *deep, heads) for p in module.parameters()]
    optimiser = torch.optim.Adam(
        parameters, lr=shape.learning_rate, weight_decay=shape.weight_decay
    )
    x_all = torch.from_numpy((rows - mean) / scale)
    y_interact = torch.from_numpy(interacted.astype(np.float32))
    like_known = torch.from_numpy(
        (interacted == 1) if liked is not None else np.zeros(len(rows), dtype=bool)
    )
    y_like = torch.from_numpy(
        liked.astype(np.float32) if liked is not None else np.zeros(len(rows), np.float32)
    )
    order = rng.permutation(len(rows))
    n_check = max(1, math.ceil(VALIDATION * len(rows)))
    check, learn = order[:n_check], order[n_check:]
    loss_fn = nn.BCEWithLogitsLoss(reduction="none")

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        logits = forward(x_all[idx])
        interact: torch.Tensor = loss_fn(logits[:, 0], y_interact[idx]).mean()
        known = like_known[idx]
        if not bool(known.any()):
            return interact
        like: torch.Tensor = loss_fn(logits[known, 1], y_like[idx][known]).mean()
        return interact + like

    best, best_state, stale, epochs = math.inf, None, 0, 0
    check_idx = torch.from_numpy(check)
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
        if checked < best - 1e-4:
            best, stale = checked, 0
            best_state = [p.detach().clone() for p in parameters]
        else:
            stale += 1
            if stale >= shape.patience:
                break
    if best_state is not None:
        with torch.no_grad():
            for p, kept in zip(parameters, best_state, strict=True):
                p.copy_(kept)

    def as_layer(module: nn.Linear) -> Layer:
        return Layer(
            module.weight.detach().numpy().T.astype(np.float32).copy(),
            module.bias.detach().numpy().astype(np.float32).copy(),
        )

    return RankerNet(
        shape,
        mean,
        scale,
        tuple(as_layer(m) for m in cross),
        tuple(as_layer(m) for m in deep),
        as_layer(heads),
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


def export_net(net: RankerNet, input_name: str, output_name: str, width: int) -> bytes:
    """The network as an ONNX graph: `input_name` [n, width] in; `output_name` [n, 1] (the
    combined score, a log-odds) and HEADS_OUTPUT [n, 2] (each head's probability) out."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def constant(name: str, value: npt.NDArray[np.generic]) -> str:
        initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], output: str) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output))
        return output

    x0 = node(
        "Mul",
        [
            node("Sub", [input_name, constant("net_mean", net.mean)], "net_centred"),
            constant("net_inverse_scale", (1.0 / net.scale).astype(np.float32)),
        ],
        "net_x0",
    )

    def linear(x: str, layer: Layer, name: str) -> str:
        """x W + b, the weights as initializers named after the layer."""
        product = node("MatMul", [x, constant(f"{name}_w", layer.weight)], f"{name}_m")
        return node("Add", [product, constant(f"{name}_b", layer.bias)], f"{name}_lin")

    h = x0
    for i, layer in enumerate(net.cross):
        crossed = node("Mul", [x0, linear(h, layer, f"net_cross{i}")], f"net_cross{i}_x")
        h = node("Add", [crossed, h], f"net_cross{i}")
    for i, layer in enumerate(net.deep):
        h = node("Relu", [linear(h, layer, f"net_deep{i}")], f"net_deep{i}")
    logits = linear(h, net.heads, "net_heads")
    probabilities = node("Sigmoid", [logits], HEADS_OUTPUT)
    # The score adds the log of the like value to the interact head's log-odds: each is
    # sliced out of the heads.
    axis = constant("net_axis", np.array([1], dtype=np.int64))
    zero, one, two = (constant(f"net_at{k}", np.array([k], dtype=np.int64)) for k in (0, 1, 2))
    interact = node("Slice", [logits, zero, one, axis], "net_interact_logit")
    like = node("Slice", [probabilities, one, two, axis], "net_p_like")
    w = net.shape.like_weight
    value = node(
        "Add",
        [
            node("Mul", [like, constant("net_like_weight", np.array(w, np.float32))], "net_wl"),
            constant("net_plain_weight", np.array(1 - w, np.float32)),
        ],
        "net_value",
    )
    floor = constant("net_like_floor", np.array(LIKE_FLOOR, np.float32))
    worth = node("Log", [node("Max", [value, floor], "net_value_floor")], "net_log_value")
    nodes.append(helper.make_node("Add", [interact, worth], [output_name], name="net_score"))
    graph = helper.make_graph(
        nodes,
        "ranker_net",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [None, width])],
        [
            helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info(HEADS_OUTPUT, TensorProto.FLOAT, [None, len(HEADS)]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # loadable by older GPU Triton releases
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())
