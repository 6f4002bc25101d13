"""World ids: stamped on every file a builder writes, carried into Triton's config, checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faiss
import onnx
import pytest
from google.protobuf import text_format
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world
from recsys_tools.world.store.identity import install_model, with_input_width, with_world_parameter
from recsys_tools.world.store.reindex import reindex_beside
from tritonclient.grpc import model_config_pb2

from app.core.errors import ConfigError
from app.release.world_match import part_mismatch
from app.world.layout import (
    INDEX_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    NEIGHBOURS_FILE,
    PAGE_NEIGHBOURS_FILE,
    SCHEMA_FILE,
    SEEN_FILE,
    SERVED_FILES,
    STAMPED_FILES,
)
from app.world.schema import load_schema, world_schema
from app.world.stamp import file_digest, read_stamp, verify_files

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [
    ROOT / "model_repository" / "ranking_model" / "config.pbtxt",
    ROOT / "deploy" / "triton" / "gpu" / "ranking_model" / "config.pbtxt",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("identity") / "world"
    build_demo_world(path, load_schema(), DemoSize(items=300, users=50, impressions=3000), seed=2)
    return path


def _parsed(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize("config", CONFIGS, ids=["local", "gpu"])
def test_the_world_parameter_parses_as_triton_config_and_is_replaced_not_repeated(
    config: Path,
) -> None:
    original = _parsed(config.read_text())
    once = with_world_parameter(config.read_text(), "first")
    twice = with_world_parameter(once, "second")
    parsed = _parsed(twice)
    assert parsed.parameters["world_id"].string_value == "second"
    assert twice.count('"world_id"') == 1
    del parsed.parameters["world_id"]
    assert parsed == original  # nothing else changed
    assert "#" in twice  # the comments survive


def test_a_stamp_covers_every_file_and_the_model_carries_it(world: Path) -> None:
    stamp = read_stamp(world)
    assert stamp is not None
    manifest = json.loads((world / MANIFEST_FILE).read_text())
    assert manifest["world_id"] == stamp.world_id
    assert set(stamp.digests) >= {"items.npz", "users.npz", INDEX_FILE, MODEL_FILE, SEEN_FILE}
    for name, digest in stamp.digests.items():
        assert file_digest(world / name) == digest
    model = onnx.load(str(world / MODEL_FILE))
    assert {p.key: p.value for p in model.metadata_props}["world_id"] == stamp.world_id
    assert load_schema(world / SCHEMA_FILE) == load_schema()


def test_install_model_writes_the_world_id_into_the_config(world: Path, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "ranking_model").mkdir(parents=True)
    shutil.copyfile(CONFIGS[1], repository / "ranking_model" / "config.pbtxt")
    target = install_model(world, repository, "ranking_model")
    stamp = read_stamp(world)
    assert stamp is not None
    assert target.read_bytes() == (world / MODEL_FILE).read_bytes()
    config = _parsed((repository / "ranking_model" / "config.pbtxt").read_text())
    assert config.parameters["world_id"].string_value == stamp.world_id


@pytest.mark.parametrize("config", CONFIGS, ids=["local", "gpu"])
def test_the_config_names_the_heads_output_only_for_a_model_that_has_it(
    world: Path, tmp_path: Path, config: Path
) -> None:
    repository = tmp_path / "models"
    (repository / "ranking_model").mkdir(parents=True)
    installed = repository / "ranking_model" / "config.pbtxt"
    shutil.copyfile(config, installed)

    def outputs() -> list[tuple[str, list[int]]]:
        return [(out.name, list(out.dims)) for out in _parsed(installed.read_text()).output]

    install_model(world, repository, "ranking_model")
    assert outputs() == [("score", [1]), ("heads", [2])]
    # A model from before the heads (one output): the config follows it, or Triton's ONNX
    # backend would refuse to load it.
    older = tmp_path / "older"
    shutil.copytree(world, older)
    model = onnx.load(str(older / MODEL_FILE))
    kept = [out for out in model.graph.output if out.name != "heads"]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    onnx.save(model, str(older / MODEL_FILE))
    install_model(older, repository, "ranking_model", version=2)
    assert outputs() == [("score", [1])]
    install_model(world, repository, "ranking_model", version=3)
    assert outputs() == [("score", [1]), ("heads", [2])]


def test_install_model_refuses_a_model_stamped_for_another_world(
    world: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(world, copy)
    model = onnx.load(str(copy / MODEL_FILE))
    onnx.helper.set_model_props(model, {"world_id": "20260101-000000-abcdef"})
    onnx.save(model, str(copy / MODEL_FILE))
    repository = tmp_path / "models"
    (repository / "ranking_model").mkdir(parents=True)
    shutil.copyfile(CONFIGS[0], repository / "ranking_model" / "config.pbtxt")
    stamp = read_stamp(copy)
    assert stamp is not None
    with pytest.raises(
        ConfigError, match=f"stamped for world 20260101-000000-abcdef.*is world {stamp.world_id}"
    ):
        install_model(copy, repository, "ranking_model")
    assert not (repository / "ranking_model" / "1").exists()  # nothing copied
    assert (repository / "ranking_model" / "config.pbtxt").read_text() == CONFIGS[0].read_text()


def test_install_model_needs_a_model_and_a_config(world: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.pbtxt is missing"):
        install_model(world, tmp_path / "empty", "ranking_model")
    with pytest.raises(ConfigError, match=r"has no model\.onnx.*recsys build-world"):
        install_model(tmp_path, tmp_path / "empty", "ranking_model")


def test_a_file_from_elsewhere_is_refused(world: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(world, copy)
    stamp = read_stamp(copy)
    assert stamp is not None
    verify_files(copy, stamp)
    (copy / INDEX_FILE).write_bytes(b"another index")
    with pytest.raises(ConfigError, match=r"index\.faiss does not belong to world"):
        verify_files(copy, stamp)


def test_a_served_file_missing_or_added_after_the_build_is_refused(
    world: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(world, copy)
    stamp = read_stamp(copy)
    assert stamp is not None
    assert NEIGHBOURS_FILE in stamp.digests
    assert PAGE_NEIGHBOURS_FILE not in stamp.digests
    kept = (copy / NEIGHBOURS_FILE).read_bytes()
    (copy / NEIGHBOURS_FILE).unlink()  # its items would quietly have no neighbours
    with pytest.raises(ConfigError, match=r"neighbours\.npz is missing .*: world .* was built"):
        verify_files(copy, stamp)
    (copy / NEIGHBOURS_FILE).mkdir()  # a directory in its place is no file either
    with pytest.raises(ConfigError, match=r"neighbours\.npz is missing or not a regular file"):
        verify_files(copy, stamp)
    (copy / NEIGHBOURS_FILE).rmdir()
    (copy / NEIGHBOURS_FILE).write_bytes(kept)
    # A page list dropped in by hand: the pages would read it, though no build wrote it.
    (copy / PAGE_NEIGHBOURS_FILE).write_bytes(kept)
    with pytest.raises(ConfigError, match=r"page_neighbours\.npz was not part of world"):
        verify_files(copy, stamp)
    (copy / PAGE_NEIGHBOURS_FILE).unlink()
    verify_files(copy, stamp)


def test_every_checked_file_is_one_the_stamp_digests() -> None:
    # verify_files refuses a checked file the manifest does not list: a served file the
    # stamp never digested would make every world refuse to start.
    assert set(SERVED_FILES) <= set(STAMPED_FILES)


def test_a_part_of_another_world_is_named_and_an_unstamped_one_accepted(world: Path) -> None:
    stamp = read_stamp(world)
    assert stamp is not None
    message = part_mismatch("Redis", "other", stamp, "load it")
    served = stamp.world_id
    assert message == f"Redis belongs to world other, this service serves world {served}: load it"
    assert part_mismatch("Redis", "", stamp, "load it") is None
    assert part_mismatch("Redis", "other", None, "load it") is None


def test_a_configured_schema_must_agree_with_the_worlds(world: Path, tmp_path: Path) -> None:
    assert world_schema(world, None) == load_schema()
    other = json.loads((world / SCHEMA_FILE).read_text())
    other["version"] = 2
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="RECSYS_FEATURE_SCHEMA"):
        world_schema(world, path)


def test_a_new_version_gets_the_model_and_the_code_version_one_runs(
    world: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    (repository / "ranking_model" / "1").mkdir(parents=True)
    shutil.copyfile(CONFIGS[0], repository / "ranking_model" / "config.pbtxt")
    local_code = ROOT / "model_repository" / "ranking_model" / "1" / "model.py"
    shutil.copyfile(local_code, repository / "ranking_model" / "1" / "model.py")
    target = install_model(world, repository, "ranking_model", version=2)
    assert target == repository / "ranking_model" / "2" / MODEL_FILE
    assert target.read_bytes() == (world / MODEL_FILE).read_bytes()
    assert (target.parent / "model.py").read_bytes() == local_code.read_bytes()
    assert not (repository / "ranking_model" / "1" / MODEL_FILE).exists()


def test_reindex_beside_keeps_the_world_and_leaves_the_original_alone(
    world: Path, tmp_path: Path
) -> None:
    before = {path.name: path.read_bytes() for path in world.iterdir() if path.is_file()}
    out = tmp_path / "reindexed"
    world_id = reindex_beside(world, out, "IVF4,Flat")
    stamp, copy = read_stamp(world), read_stamp(out)
    assert stamp is not None
    assert copy is not None
    assert world_id == copy.world_id == stamp.world_id
    assert copy.digests[INDEX_FILE] != stamp.digests[INDEX_FILE]
    verify_files(out, copy)  # the manifest names the new index
    index = faiss.read_index(str(out / INDEX_FILE))
    assert index.ntotal == faiss.read_index(str(world / INDEX_FILE)).ntotal
    assert faiss.extract_index_ivf(index).nlist == 4
    after = {path.name: path.read_bytes() for path in world.iterdir() if path.is_file()}
    assert after == before
    with pytest.raises(ConfigError, match="exists"):
        reindex_beside(world, out, "Flat")


def _trt(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    return {
        key: value for accelerator in accelerators for key, value in accelerator.parameters.items()
    }


@pytest.mark.parametrize("config", CONFIGS, ids=["local", "gpu"])
def test_a_wider_world_gets_its_width_in_every_shape_of_the_config(config: Path) -> None:
    """A world whose schema packs the sequence block (123 columns) serves from the shipped
    configs: the input's dims, its warmups and its TensorRT profile all take the width."""
    text = with_input_width(config.read_text(), "features", 123)
    parsed = _parsed(text)
    assert list(parsed.input[0].dims) == [123]
    assert list(parsed.output[0].dims) == [1]
    for warmup in parsed.model_warmup:
        assert list(warmup.inputs["features"].dims) == [123]
    shapes = [value for key, value in _trt(parsed).items() if "profile" in key]
    assert all(shape.endswith("x123") for shape in shapes)
    assert with_input_width(text, "features", 123) == text
