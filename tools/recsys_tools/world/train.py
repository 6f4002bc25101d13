"""Train the ranking MLP on the world's impressions and export it to ONNX.

scikit-learn trains, skl2onnx exports; neither is needed to serve. The training rows come
from the same pack_rows the service uses, so the model sees exactly what it will be sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.packing import pack_rows
from app.schema import FeatureSchema
from recsys_tools.world.synth import World

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class TrainingReport:
    train_rows: int
    test_rows: int
    click_rate: float
    auc_model: float
    auc_popularity: float
    auc_similarity: float

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class TrainedRanker:
    onnx_model: bytes
    report: TrainingReport


def training_rows(world: World, schema: FeatureSchema) -> FloatArray:
    impressions = world.interactions
    user_blobs = np.concatenate([world.users.embeddings, world.users.dense], axis=1)[
        impressions.users
    ]
    item_blobs = np.concatenate([world.items.embeddings, world.items.dense], axis=1)[
        impressions.items
    ]
    return pack_rows(schema, user_blobs, item_blobs, impressions.contexts)


def auc(labels: npt.NDArray[np.int8], scores: npt.NDArray[np.floating]) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def train_ranker(world: World, schema: FeatureSchema, seed: int = 7) -> TrainedRanker:
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rows = training_rows(world, schema)
    labels = world.interactions.clicked
    rng = np.random.default_rng(seed)
    test = rng.random(len(labels)) < 0.2
    model = make_pipeline(
        StandardScaler(),
        MLPClassifier(
            hidden_layer_sizes=(64, 32),
            batch_size=512,
            learning_rate_init=2e-3,
            max_iter=40,
            early_stopping=True,
            n_iter_no_change=4,
            random_state=seed,
        ),
    )
    model.fit(rows[~test], labels[~test])
    product = schema.blocks["user_item_product"]
    report = TrainingReport(
        train_rows=int((~test).sum()),
        test_rows=int(test.sum()),
        click_rate=float(labels.mean()),
        auc_model=auc(labels[test], model.predict_proba(rows[test])[:, 1]),
        auc_popularity=auc(labels[test], world.items.popularity[world.interactions.items[test]]),
        auc_similarity=auc(labels[test], rows[test][:, product].sum(axis=1)),
    )
    return TrainedRanker(export_onnx(model, schema), report)


def export_onnx(model: object, schema: FeatureSchema) -> bytes:
    """Export with the schema's input name and a single [n, 1] click-probability output."""
    import onnx
    from onnx import helper, numpy_helper
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    converted = to_onnx(
        model,
        initial_types=[(schema.input_name, FloatTensorType([None, schema.width]))],
        options={"zipmap": False},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    graph = converted.graph
    probabilities = next(out.name for out in graph.output if out.name != "label")
    # Column 1 of the class probabilities is P(click); slice it out as [n, 1].
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([1], dtype=np.int64), "score_start"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "score_end"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "score_axis"),
        ]
    )
    graph.node.append(
        helper.make_node(
            "Slice",
            [probabilities, "score_start", "score_end", "score_axis"],
            [schema.output_name],
            name="click_probability",
        )
    )
    graph.output.append(
        helper.make_tensor_value_info(schema.output_name, onnx.TensorProto.FLOAT, [None, 1])
    )
    pruned = onnx.utils.Extractor(converted).extract_model(
        [schema.input_name], [schema.output_name]
    )
    pruned.ir_version = min(pruned.ir_version, 8)  # loadable by older GPU Triton releases
    onnx.checker.check_model(pruned)
    return bytes(pruned.SerializeToString())
