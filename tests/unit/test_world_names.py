"""World ids and model names: one shape, checked where each is read, before it can name a
directory or go into a Triton config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.errors import ConfigError, SchemaError
from app.core.settings import Settings
from app.release.worlds import WorldRef, read_worlds, world_settings
from app.world.layout import MANIFEST_FILE
from app.world.schema import is_name, load_schema, parse_schema
from app.world.stamp import read_stamp

TRAVERSAL = "x/../../../../escaped"
# A quote and a newline would end the config's string and add a field of their own.
INJECTED = 'ranking_model"\nmax_batch_size: 1\n#'


@pytest.mark.parametrize(
    "name",
    ["20261204-123921-f8f58c", "ranking_model", "ranking_model_20261204_123921_f8f58c", "a" * 64],
)
def test_a_builders_ids_and_names_are_names(name: str) -> None:
    assert is_name(name)


@pytest.mark.parametrize(
    "name",
    [TRAVERSAL, INJECTED, "..", "a.b", "a b", 'a"b', "a\\b", "", "a" * 65, "abc\n", 7, None],
)
def test_anything_else_is_not(name: object) -> None:
    assert not is_name(name)


def _manifest(world: Path, manifest: object) -> Path:
    world.mkdir(exist_ok=True)
    (world / MANIFEST_FILE).write_text(json.dumps(manifest))
    return world


def test_a_manifests_id_is_refused_naming_the_file_and_the_field(tmp_path: Path) -> None:
    world = _manifest(tmp_path / "w", {"world_id": TRAVERSAL, "files": {}})
    with pytest.raises(ConfigError, match=r"manifest\.json: world_id is 'x/\.\./"):
        read_stamp(world)
    world = _manifest(tmp_path / "w", {"world_id": "20261204-123921-f8f58c", "files": {}})
    stamp = read_stamp(world)
    assert stamp is not None
    assert stamp.world_id == "20261204-123921-f8f58c"


@pytest.mark.parametrize(
    ("manifest", "says"),
    [([1, 2], "not a JSON object"), ({"world_id": "w", "files": ["a"]}, "files must map")],
)
def test_a_manifest_of_another_shape_is_refused_not_a_traceback(
    tmp_path: Path, manifest: object, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        read_stamp(_manifest(tmp_path / "w", manifest))


def test_a_schemas_model_name_is_refused_naming_the_file_and_the_field() -> None:
    spec = json.loads(load_schema().source)
    spec["model"]["name"] = INJECTED
    with pytest.raises(SchemaError, match=r"(?s)feature_schema\.json is invalid.*model\.name"):
        parse_schema(json.dumps(spec), "world/feature_schema.json")


def test_the_worlds_files_model_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "worlds.toml"
    path.write_text(
        '[candidate]\nartifacts_dir = "/w"\nkey_prefix = "p"\nmodel_name = "../m"\npercent = 5\n'
    )
    with pytest.raises(ConfigError, match=r"worlds\.toml: \[candidate\] model_name is '\.\./m'"):
        read_worlds(path)


def test_a_world_named_by_admin_with_such_a_model_is_not_served() -> None:
    with pytest.raises(ConfigError, match="model_name is"):
        world_settings(Settings(), WorldRef(Path("/w"), "p", INJECTED))
