"""manifest.json read and written in one place: whatever a file holds, a reader gets the
typed manifest or one ConfigError naming the file, never a parser's traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.errors import ConfigError
from app.world.layout import MANIFEST_FILE
from app.world.manifest import Manifest, manifest_items, read_manifest, update_manifest


def _world(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / MANIFEST_FILE
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        "null",
        "7",
        "",
        "{",
        b"\xff\xfe{}",  # not UTF-8
        "[" * 100_000,  # deeper than the parser's stack
    ],
)
def test_a_manifest_that_is_no_json_object_is_one_config_error(
    tmp_path: Path, text: str | bytes
) -> None:
    world = _world(tmp_path, text)
    with pytest.raises(ConfigError, match=r"manifest\.json .*rebuild the world"):
        read_manifest(world)
    with pytest.raises(ConfigError, match=r"manifest\.json"):
        update_manifest(world, items=3)  # nothing to merge into: the build says so
    assert manifest_items(world) == 0  # the memory estimate reads none


def test_a_world_without_a_manifest_reads_empty(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) == Manifest()
    assert manifest_items(tmp_path) == 0


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"world_id": "a/../b"}, "world_id"),
        ({"world_id": 7}, "world_id"),
        ({"world_id": "w1", "files": ["items.npz"]}, "files must map"),
        ({"files": "items.npz"}, "files must map"),
    ],
)
def test_an_id_or_digests_of_the_wrong_shape_are_refused_naming_the_file(
    tmp_path: Path, fields: dict[str, object], refused: str
) -> None:
    world = _world(tmp_path, json.dumps(fields))
    with pytest.raises(ConfigError, match=rf"manifest\.json: {refused}.*rebuild the world"):
        read_manifest(world)


def test_a_huge_id_is_not_repeated_whole(tmp_path: Path) -> None:
    world = _world(tmp_path, json.dumps({"world_id": "x/" * 1_000_000}))
    with pytest.raises(ConfigError, match=r"manifest\.json: world_id is 'x/x/") as refused:
        read_manifest(world)
    assert len(str(refused.value)) < 400


@pytest.mark.parametrize(
    ("items", "counted"),
    [
        (1200, 1200),
        ("1200", 1200),
        (-5, 0),
        ("x", 0),
        ([3], 0),
        (None, 0),
        (True, 0),
        (2**53, 2**53),
        (2**53 + 1, 0),  # past a float's exact integers: the memory estimate would overflow
        (1e308, 0),
        (10**400, 0),
    ],
)
def test_the_item_count_is_a_count_or_none(tmp_path: Path, items: object, counted: int) -> None:
    world = _world(tmp_path, json.dumps({"items": items}))
    assert manifest_items(world) == counted


def test_an_infinite_item_count_reads_none(tmp_path: Path) -> None:
    # Python's parser reads 1e400 as inf and takes Infinity; int() of either overflows.
    for text in ('{"items": 1e400}', '{"items": Infinity}'):
        assert manifest_items(_world(tmp_path, text)) == 0


def test_a_write_merges_into_what_is_there(tmp_path: Path) -> None:
    update_manifest(tmp_path, items=3, files={"items.npz": "ab"})
    update_manifest(tmp_path, world_id="20261206-120000-abcdef", training={"rows": 9})
    manifest = read_manifest(tmp_path)
    assert (manifest.world_id, manifest.files, manifest.items, manifest.source) == (
        "20261206-120000-abcdef",
        {"items.npz": "ab"},
        3,
        None,
    )
    assert json.loads((tmp_path / MANIFEST_FILE).read_text())["training"] == {"rows": 9}
    # Replaced whole: no temporary file is left beside it.
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]
