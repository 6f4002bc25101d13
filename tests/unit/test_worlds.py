"""The worlds file, the user -> world choice, a world's settings and its memory check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.errors import ConfigError
from app.core.settings import Settings
from app.process.worlds import checked_memory, world_memory_bytes
from app.release.plan import in_share
from app.release.worlds import (
    WorldRef,
    WorldsPlan,
    candidate_user,
    read_worlds,
    world_settings,
    write_worlds,
)
from app.world.schema import load_schema

NEXT = WorldRef(Path('/srv/worlds/next "b"'), "recsys-next", "ranking_model_next")


def test_the_file_round_trips_and_is_absent_until_written(tmp_path: Path) -> None:
    path = tmp_path / "worlds.toml"
    assert read_worlds(path) == WorldsPlan()
    assert read_worlds(None) == WorldsPlan()
    plan = WorldsPlan(stable=WorldRef(Path("/srv/a"), "recsys-a"), candidate=NEXT, percent=12.5)
    write_worlds(path, plan)
    assert read_worlds(path) == plan
    write_worlds(path, plan.promoted())
    assert read_worlds(path) == WorldsPlan(stable=NEXT)
    write_worlds(path, WorldsPlan())
    assert read_worlds(path) == WorldsPlan()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[candidate]\nartifacts_dir = '/w'\nkey_prefix = 'p'\npercent = 101\n", "percent"),
        ("[candidate]\nartifacts_dir = '/w'\nkey_prefix = 'p{x}'\n", "key_prefix"),
        ("[candidate]\nkey_prefix = 'p'\n", "artifacts_dir"),
        ("[stable]\nartifacts_dir = '/w'\nkey_prefix = 'p'\npercent = 5\n", "unknown keys"),
        ("[model]\nstable = '1'\n", "unknown tables"),
        ("[stable\n", "not readable TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_what(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "worlds.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        read_worlds(path)


def test_there_is_nothing_to_promote_without_a_candidate() -> None:
    with pytest.raises(ConfigError, match="no candidate"):
        WorldsPlan(stable=NEXT).promoted()


def test_a_users_world_is_stable_and_drawn_apart_from_the_model_canary() -> None:
    users = [f"user-{n}" for n in range(20_000)]
    chosen = [u for u in users if candidate_user(u, 10.0)]
    assert 0.08 < len(chosen) / len(users) < 0.12
    assert chosen == [u for u in users if candidate_user(u, 10.0)]
    assert all(candidate_user(u, 30.0) for u in chosen)  # a larger share keeps its users
    canary = {u for u in users if in_share(u, 10.0)}
    both = len(canary & set(chosen)) / len(users)
    assert 0.005 < both < 0.02  # about 10% of 10%: independent draws, not the same users


def test_a_worlds_settings_keep_the_event_log_and_drop_the_model_release() -> None:
    base = Settings(redis_key_prefix="recsys", release_file=Path("/etc/recsys/release.toml"))
    served = world_settings(base, NEXT)
    assert served.artifacts_dir == NEXT.artifacts_dir
    assert served.redis_key_prefix == "recsys-next"
    assert served.event_key_prefix == "recsys"  # the one log every world reads
    assert served.model_name == "ranking_model_next"
    assert served.release_file is None
    assert world_settings(base, None) is base


def _world(tmp_path: Path, items: int) -> Path:
    world = tmp_path / "world"
    world.mkdir()
    (world / "index.faiss").write_bytes(b"x" * 1000)
    (world / "items.npz").write_bytes(b"x" * 500)
    (world / "holdout.npz").write_bytes(b"x" * 10**6)  # the tools', never loaded
    (world / "manifest.json").write_text(json.dumps({"items": items}))
    return world


def test_a_worlds_memory_is_its_loaded_files_and_its_held_features(tmp_path: Path) -> None:
    world = _world(tmp_path, items=1000)
    width = load_schema().item_blob_width
    held = Settings(artifacts_dir=world, catalog_headroom=0)
    assert world_memory_bytes(held, 1000, width) == int((1500 + 1000 * width * 4) * 1.25)
    off = held.model_copy(update={"item_features": "off"})
    assert world_memory_bytes(off, 1000, width) == int(1500 * 1.25)


def test_a_world_taking_more_than_the_host_spares_is_refused(tmp_path: Path) -> None:
    world = _world(tmp_path, items=100_000)
    settings = Settings(artifacts_dir=world)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000000 kB\nMemAvailable: 10000 kB\n")
    with pytest.raises(ConfigError, match="MiB available"):
        checked_memory(settings, 0.2, meminfo)
    meminfo.write_text("MemAvailable: 50000000 kB\n")
    assert checked_memory(settings, 0.2, meminfo) > 100_000
    with pytest.raises(ConfigError, match="not a directory"):
        checked_memory(Settings(artifacts_dir=tmp_path / "none"), 0.2, meminfo)
