"""Reduced precision that never ties the score: the score's tail stays in FP32.

In FP16 a number near 30 has a step of 1/64: a log-odds score rounded there makes distinct
candidates equal, and their order whatever came before (the saturated sigmoid's failure,
again). The heavy part of the ranker is its tower (the matrix products over the row); the
score's tail, from the heads' logits on, and the blend that reads the row's own product and
sequence columns, cost a few operations a row. So they stay in FP32 in every reduced copy:
the tower's small rounding moves a score a little, it never makes two scores one.
"""

from __future__ import annotations

from typing import Any

# The exported network's heads (export.export_net names each node by its output) and the
# prefix of every node the blend appends (blend.blended_onnx).
HEADS_MATMUL = "net_heads_m"
BLEND_PREFIX = "blend_"


def score_tail(model: Any) -> list[str]:
    """The names of the nodes from the heads' logits to the score, and the blend's: none for
    a graph this project did not export."""
    graph = model.graph
    reached: set[str] = set()
    names: list[str] = []
    for node in graph.node:  # exported in topological order
        downstream = node.name == HEADS_MATMUL or any(name in reached for name in node.input)
        if downstream or node.name.startswith(BLEND_PREFIX):
            reached.update(node.output)
            names.append(node.name)
    return names


def fp16_copy(model: Any) -> Any:
    """The model in FP16 but for its score's tail; inputs and outputs stay FP32.

    The tower reads the row through one cast to FP16 and hands its last activation on
    through one cast back; the tail and the blend compute in FP32 from the FP32 row itself.
    (onnxruntime's converter with a block list rounds every tensor between blocked nodes to
    FP16, the row included, so the tail would tie all the same.) A graph with no tail of
    this project's is converted whole.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.transformers.float16 import convert_float_to_float16

    tail = set(score_tail(model))
    if not tail:
        return convert_float_to_float16(model, keep_io_types=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    tower = [node for node in graph.node if node.name not in tail]
    produced = {name for node in tower for name in node.output}
    used_by_tail = {name for node in graph.node if node.name in tail for name in node.input}
    inputs = {value.name for value in graph.input}
    into, out_of = [], []
    for name in sorted(inputs & {i for node in tower for i in node.input}):
        into.append(helper.make_node("Cast", [name], [f"{name}_fp16"], to=TensorProto.FLOAT16))
        for node in tower:
            node.input[:] = [f"{name}_fp16" if i == name else i for i in node.input]
    for name in sorted(produced & used_by_tail):
        out_of.append(helper.make_node("Cast", [name], [f"{name}_fp32"], to=TensorProto.FLOAT))
        for node in graph.node:
            if node.name in tail:
                node.input[:] = [f"{name}_fp32" if i == name else i for i in node.input]
    towers_own = {i for node in tower for i in node.input} - used_by_tail
    for k, initializer in enumerate(graph.initializer):
        if initializer.name in towers_own and initializer.data_type == TensorProto.FLOAT:
            half = numpy_helper.to_array(initializer).astype("float16")
            graph.initializer[k].CopyFrom(numpy_helper.from_array(half, initializer.name))
    nodes = [*into, *tower, *out_of, *(node for node in graph.node if node.name in tail)]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    onnx.checker.check_model(copy)
    return copy


def ties_made(full: Any, reduced: Any) -> tuple[int, float]:
    """Of one request's candidates, how many the reduction made equal to another that FP32
    told apart, and the widest FP32 gap between candidates it made equal (0 if none)."""
    import numpy as np

    groups, inverse = np.unique(reduced, return_inverse=True)
    lost, gap = 0, 0.0
    for group in range(len(groups)):
        members = full[inverse == group]
        if len(members) > 1:
            distinct = np.unique(members)
            lost += len(distinct) - 1
            gap = max(gap, float(distinct[-1] - distinct[0]))
    return lost, gap
