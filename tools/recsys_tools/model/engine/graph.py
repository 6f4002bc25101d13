"""The ranker's inputs and outputs as the ONNX file declares them.

Read once into plain records, so the checks compare the model with the config and the schema
on the same terms, without each knowing the ONNX protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ONNX_FLOAT = 1  # onnx.TensorProto.FLOAT


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    elem_type: int
    dims: tuple[int | str, ...]  # a str for a dimension without a fixed size


def _tensor(value_info: Any) -> Tensor:
    tensor_type = value_info.type.tensor_type
    dims = tuple(
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
        for d in tensor_type.shape.dim
    )
    return Tensor(value_info.name, int(tensor_type.elem_type), dims)


def graph_io(model: Any) -> tuple[list[Tensor], list[Tensor]]:
    weights = {init.name for init in model.graph.initializer}
    inputs = [_tensor(vi) for vi in model.graph.input if vi.name not in weights]
    return inputs, [_tensor(vi) for vi in model.graph.output]
