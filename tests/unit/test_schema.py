import dataclasses
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from app.core.errors import SchemaError
from app.world.schema import (
    HEAD_NAMES,
    HEADS_OUTPUT,
    ModelSignature,
    load_schema,
    parse_schema,
    signature_mismatches,
)
from tests.unit.tiny_schema import TINY_SCHEMA_JSON, tiny_schema

ROOT = Path(__file__).resolve().parents[2]


MATCHING = ModelSignature(
    name="m",
    version="1",
    input_name="features",
    input_datatype="FP32",
    input_shape=(-1, 15),
    output_name="score",
    output_datatype="FP32",
    max_batch_size=256,
)


def _signature(**changes: Any) -> ModelSignature:
    return dataclasses.replace(MATCHING, **changes)


def test_tiny_schema_resolves_block_offsets() -> None:
    schema = tiny_schema()
    assert schema.width == 15
    assert schema.blocks["user_item_product"] == slice(4, 6)
    assert schema.blocks["context"] == slice(8, 15)
    assert (schema.user_blob_width, schema.item_blob_width) == (3, 3)


def test_matching_signature_has_no_problems() -> None:
    assert signature_mismatches(tiny_schema(), _signature()) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"input_name": "x"}, "input name"),
        ({"input_datatype": "FP16"}, "input datatype"),
        ({"input_shape": (-1, 16)}, "input width is 16, schema packs 15"),
        ({"output_name": "prob"}, "output name"),
        ({"output_datatype": "FP64"}, "output datatype"),
        ({"max_batch_size": 0}, "no batch dimension"),
    ],
)
def test_each_mismatch_is_named(change: dict[str, object], problem: str) -> None:
    problems = signature_mismatches(tiny_schema(), _signature(**change))
    assert len(problems) == 1
    assert problem in problems[0]


def test_layout_must_name_every_block() -> None:
    broken = TINY_SCHEMA_JSON.replace('"user_item_product",', "")
    with pytest.raises(SchemaError, match="layout must name each"):
        parse_schema(broken)


def test_vocabularies_need_other() -> None:
    with pytest.raises(SchemaError, match=r"context\.device"):
        parse_schema(TINY_SCHEMA_JSON.replace('"device": ["mobile", "other"]', '"device": ["m"]'))


def test_unreadable_schema_file(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="cannot read"):
        load_schema(tmp_path / "absent.json")


def _model_config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize(
    "config_path",
    [
        "model_repository/ranking_model/config.pbtxt",
        "deploy/triton/gpu/ranking_model/config.pbtxt",
    ],
)
def test_triton_configs_agree_with_the_packaged_schema(config_path: str) -> None:
    schema = load_schema()
    config = _model_config(ROOT / config_path)
    assert config.name == schema.model_name
    assert [i.name for i in config.input] == [schema.input_name]
    assert list(config.input[0].dims) == [schema.width]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    # The score, then each head's probability (install-model drops them for a headless model).
    assert [o.name for o in config.output] == [schema.output_name, HEADS_OUTPUT]
    assert list(config.output[0].dims) == [1]
    assert list(config.output[1].dims) == [len(HEAD_NAMES)]
    assert config.max_batch_size >= 1024
    assert config.HasField("dynamic_batching")
