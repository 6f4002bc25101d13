"""The ranking network written as an ONNX graph from its learnt weights, directly.

MatMul, Add, Mul, Relu, Sigmoid, Log: the few operators every Triton backend and TensorRT
run, with no exporter between the weights and the served file (net.py has the equations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from app.world.schema import HEADS_OUTPUT
from recsys_tools.world.learn.ranker.net import HEADS, LIKE_FLOOR, Layer, RankerNet

if TYPE_CHECKING:
    import onnx


@dataclass(slots=True)
class _Graph:
    """Nodes and initializers as they are added; each node is named by its output."""

    initializers: list[onnx.TensorProto] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)

    def constant(self, name: str, value: npt.NDArray[np.generic]) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], output: str) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output))
        return output

    def linear(self, x: str, layer: Layer, name: str) -> str:
        """x W + b, the weights as initializers named after the layer."""
        product = self.node("MatMul", [x, self.constant(f"{name}_w", layer.weight)], f"{name}_m")
        return self.node("Add", [product, self.constant(f"{name}_b", layer.bias)], f"{name}_lin")


def _logits(graph: _Graph, net: RankerNet, input_name: str) -> str:
    """The heads' logits: the row standardised, through the cross layers and the tower."""
    centred = graph.node("Sub", [input_name, graph.constant("net_mean", net.mean)], "net_centred")
    inverse = graph.constant("net_inverse_scale", (1.0 / net.scale).astype(np.float32))
    x0 = graph.node("Mul", [centred, inverse], "net_x0")
    h = x0
    for i, layer in enumerate(net.cross):
        crossed = graph.node(
            "Mul", [x0, graph.linear(h, layer, f"net_cross{i}")], f"net_cross{i}_x"
        )
        h = graph.node("Add", [crossed, h], f"net_cross{i}")
    for i, layer in enumerate(net.deep):
        h = graph.node("Relu", [graph.linear(h, layer, f"net_deep{i}")], f"net_deep{i}")
    return graph.linear(h, net.heads, "net_heads")


def _score(graph: _Graph, net: RankerNet, logits: str, probabilities: str, output: str) -> None:
    """The interact head's log-odds plus the log of the like value: each sliced from the heads."""
    from onnx import helper

    axis = graph.constant("net_axis", np.array([1], dtype=np.int64))
    zero, one, two = (
        graph.constant(f"net_at{k}", np.array([k], dtype=np.int64)) for k in (0, 1, 2)
    )
    interact = graph.node("Slice", [logits, zero, one, axis], "net_interact_logit")
    like = graph.node("Slice", [probabilities, one, two, axis], "net_p_like")
    w = net.shape.like_weight
    weighted = graph.node(
        "Mul", [like, graph.constant("net_like_weight", np.array(w, np.float32))], "net_wl"
    )
    plain = graph.constant("net_plain_weight", np.array(1 - w, np.float32))
    value = graph.node("Add", [weighted, plain], "net_value")
    floor = graph.constant("net_like_floor", np.array(LIKE_FLOOR, np.float32))
    floored = graph.node("Max", [value, floor], "net_value_floor")
    worth = graph.node("Log", [floored], "net_log_value")
    graph.nodes.append(helper.make_node("Add", [interact, worth], [output], name="net_score"))


def export_net(net: RankerNet, input_name: str, output_name: str, width: int) -> bytes:
    """The network as an ONNX graph: `input_name` [n, width] in; `output_name` [n, 1] (the
    combined score, a log-odds) and HEADS_OUTPUT [n, 2] (each head's probability) out."""
    import onnx
    from onnx import TensorProto, helper

    graph = _Graph()
    logits = _logits(graph, net, input_name)
    probabilities = graph.node("Sigmoid", [logits], HEADS_OUTPUT)
    _score(graph, net, logits, probabilities, output_name)
    made = helper.make_graph(
        graph.nodes,
        "ranker_net",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [None, width])],
        [
            helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [None, 1]),
            helper.make_tensor_value_info(HEADS_OUTPUT, TensorProto.FLOAT, [None, len(HEADS)]),
        ],
        graph.initializers,
    )
    model = helper.make_model(made, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # loadable by older GPU Triton releases
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())
