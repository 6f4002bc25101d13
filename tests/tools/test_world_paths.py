"""A world's id and model name, as the retrain job writes them, never lead the job that stages
worlds outside Triton's model repository or into a config.pbtxt field of their own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import pytest
import redis
from google.protobuf import text_format
from recsys_tools.retrain import CANDIDATE_LINK
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.store.identity import (
    install_model,
    model_beside,
    new_world_id,
    with_world_parameter,
)
from recsys_tools.world_advance import next_world
from recsys_tools.worlds_client import candidate_names, stage
from tritonclient.grpc import model_config_pb2

from app.core.errors import ConfigError, SchemaError
from app.world.layout import MODEL_FILE, SCHEMA_FILE
from app.world.manifest import update_manifest
from app.world.schema import is_name, load_schema

ROOT = Path(__file__).resolve().parents[2]
LOCAL_CONFIG = ROOT / "model_repository" / "ranking_model" / "config.pbtxt"
TRAVERSAL = "x/../../../../escaped"
INJECTED = 'ranking_model"\nmax_batch_size: 1\n#'
# Never called: each refusal comes before the first key is written.
NO_REDIS = cast(redis.Redis, object())


def _files(root: Path) -> set[Path]:
    return {path for path in root.rglob("*")}


def _world(tmp_path: Path, world_id: str, model: str = "ranking_model") -> Path:
    world = tmp_path / "worlds" / "next"
    world.mkdir(parents=True)
    spec = json.loads(load_schema().source)
    spec["model"]["name"] = model
    (world / SCHEMA_FILE).write_text(json.dumps(spec))
    (world / MODEL_FILE).write_bytes(b"onnx")
    update_manifest(world, world_id=world_id, files={})
    return world


def _repository(tmp_path: Path) -> Path:
    repository = tmp_path / "deep" / "er" / "models"
    (repository / "ranking_model" / "1").mkdir(parents=True)
    shutil.copyfile(LOCAL_CONFIG, repository / "ranking_model" / "config.pbtxt")
    return repository


def test_the_ids_and_names_the_builder_makes_are_names() -> None:
    assert is_name(new_world_id())
    assert is_name(load_schema().model_name)
    assert is_name(load_schema(interactions_schema_path()).model_name)


def test_a_traversal_id_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    world = _world(tmp_path, TRAVERSAL)
    repository = _repository(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(ConfigError, match=r"manifest\.json: world_id is 'x/\.\./"):
        candidate_names(world)
    with pytest.raises(ConfigError, match="the model's name is"):
        stage(world, NO_REDIS, repository, "recsys-x", f"ranking_model_{TRAVERSAL}")
    with pytest.raises(ConfigError, match="the model's name is"):
        install_model(world, repository, TRAVERSAL)
    with pytest.raises(ConfigError, match="the model's name is"):
        model_beside(repository, "ranking_model", "../../escaped")
    assert _files(tmp_path) == before


def test_an_injected_model_name_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    world = _world(tmp_path, "20261204-123921-f8f58c", model=INJECTED)
    repository = _repository(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(SchemaError, match=r"model\.name"):
        candidate_names(world)
    with pytest.raises(ConfigError, match="the model's name is"):
        model_beside(repository, "ranking_model", INJECTED)
    with pytest.raises(ConfigError, match="the world's id is"):
        with_world_parameter(LOCAL_CONFIG.read_text(), 'x" }\n}\nname: "evil')
    assert _files(tmp_path) == before


def test_a_link_planted_in_the_repository_writes_nothing_outside(tmp_path: Path) -> None:
    world = _world(tmp_path, "20261204-123921-f8f58c")
    repository = _repository(tmp_path)
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    (outside / "config.pbtxt").write_text(LOCAL_CONFIG.read_text())
    (repository / "planted").symlink_to(outside)
    before = _files(outside)
    with pytest.raises(ConfigError, match="lies outside"):
        install_model(world, repository, "planted")
    with pytest.raises(ConfigError, match="lies outside"):
        model_beside(repository, "planted", "ranking_model_next")
    assert _files(outside) == before


def test_a_worlds_own_names_stage_a_config_that_says_exactly_them(tmp_path: Path) -> None:
    world_id = new_world_id()
    world = _world(tmp_path, world_id)
    repository = _repository(tmp_path)
    prefix, model = candidate_names(world)
    assert (prefix, model) == (f"recsys-{world_id}", f"ranking_model_{world_id}".replace("-", "_"))
    model_beside(repository, "ranking_model", model)
    text = with_world_parameter((repository / model / "config.pbtxt").read_text(), world_id)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == model
    assert config.parameters["world_id"].string_value == world_id


def test_a_candidate_link_leading_out_of_the_worlds_is_refused(tmp_path: Path) -> None:
    elsewhere = _world(tmp_path / "elsewhere", "20261204-123921-f8f58c")
    worlds = tmp_path / "worlds"
    worlds.mkdir()
    (worlds / CANDIDATE_LINK).symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="outside"):
        next_world(worlds, {"stable": "", "candidate": ""}, {})
