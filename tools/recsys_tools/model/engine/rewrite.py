"""TensorRT's ONNX parser has no ai.onnx.ml operators, so the ranker is rewritten for it.

The exported ranker standardises its input with an ai.onnx.ml Scaler, which stops trtexec
and, under onnxruntime, splits the graph around a CPU node. The same arithmetic in standard
operators lets TensorRT take the graph whole; the copy is served only if it scores exactly as
the world's model does.
"""

from __future__ import annotations

from typing import Any

from app.core.errors import ConfigError
from recsys_tools.model.engine.graph import ONNX_FLOAT
from recsys_tools.model.engine.scoring import scores

ML_DOMAIN = "ai.onnx.ml"
IDENTITY_ROWS = 256  # random rows: the TensorRT-ready copy must score them as the original does
IDENTITY_TOLERANCE = 1e-6


def tensorrt_graph(model: Any) -> tuple[Any, int]:
    """A copy with each ai.onnx.ml Scaler written as Sub and Mul, and how many were rewritten.

    TensorRT's ONNX parser has no ai.onnx.ml operators: a Scaler (the exported ranker's input
    standardisation) stops trtexec, and under onnxruntime it runs on the CPU outside the
    engine. (x - offset) * scale in the standard domain is the same arithmetic.
    """
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    floats = _float_tensors(copy)
    nodes, rewritten = [], 0
    for node in copy.graph.node:
        if node.domain == ML_DOMAIN and node.op_type == "Scaler" and node.input[0] in floats:
            nodes.extend(_sub_mul(copy.graph, node))
            rewritten += 1
        else:
            nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    if not any(node.domain == ML_DOMAIN for node in copy.graph.node):
        kept = [op for op in copy.opset_import if op.domain != ML_DOMAIN]
        del copy.opset_import[:]
        copy.opset_import.extend(kept)
    return copy, rewritten


def _float_tensors(model: Any) -> set[str]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    infos = [*graph.input, *graph.value_info, *graph.output]
    return {vi.name for vi in infos if vi.type.tensor_type.elem_type == ONNX_FLOAT}


def _sub_mul(graph: Any, node: Any) -> list[Any]:
    import numpy as np
    from onnx import helper, numpy_helper

    attributes = {a.name: list(a.floats) for a in node.attribute}
    base = f"{node.name or node.output[0]}_trt"
    offset, scale, centred = f"{base}_offset", f"{base}_scale", f"{base}_centred"
    for name, values, default in ((offset, "offset", 0.0), (scale, "scale", 1.0)):
        array = np.asarray(attributes.get(values) or [default], dtype=np.float32)
        graph.initializer.append(numpy_helper.from_array(array, name))
    return [
        helper.make_node("Sub", [node.input[0], offset], [centred], name=f"{base}_sub"),
        helper.make_node("Mul", [centred, scale], [node.output[0]], name=f"{base}_mul"),
    ]


def foreign_ops(model: Any) -> list[str]:
    """Operators outside the standard ONNX domain, which TensorRT cannot build."""
    return sorted(
        {f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    )


def check_identity(original: Any, ready: Any, width: int, rewritten: int) -> str:
    """The copy TensorRT gets must score exactly as the world's model does."""
    import numpy as np

    rows = np.random.default_rng(0).normal(size=(IDENTITY_ROWS, width)).astype(np.float32)
    diff = float(np.abs(scores(original, rows) - scores(ready, rows)).max())
    if not diff <= IDENTITY_TOLERANCE:
        raise ConfigError(
            f"the TensorRT-ready copy of model.onnx scores differently (max |diff| {diff:g} "
            f"over {IDENTITY_ROWS} rows): serve the world's model as it is (recsys install-model)"
        )
    what = f"{rewritten} ai.onnx.ml Scaler written as Sub+Mul" if rewritten else "unchanged"
    return f"model.onnx for TensorRT ({what}) scores as the world's: max |diff| {diff:g}"
