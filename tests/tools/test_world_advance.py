"""When `recsys release world advance` loads the retrain's accepted world, and when it says
why not: a world is loaded once, and never over a candidate still being judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recsys_tools.cli import main
from recsys_tools.retrain import CANDIDATE_LINK
from recsys_tools.world_advance import ADVANCED_FILE, loaded_before, next_world

from app.world.manifest import update_manifest

NEW = "20261204-031500-abc123"
OLD = "20261203-031500-def456"


def _worlds(tmp_path: Path) -> Path:
    worlds = tmp_path / "worlds"
    (worlds / NEW).mkdir(parents=True)
    update_manifest(worlds / NEW, world_id=NEW, files={})
    (worlds / CANDIDATE_LINK).symlink_to(NEW)
    return worlds


def _state(stable: str = OLD, candidate: str = "") -> dict[str, Any]:
    return {"stable": stable, "candidate": candidate}


def test_the_accepted_world_is_loaded_when_nothing_else_is_judged(tmp_path: Path) -> None:
    worlds = _worlds(tmp_path)
    world, why = next_world(worlds, _state(), {})
    assert world == (worlds / NEW).resolve()
    assert why == ""


def test_nothing_is_loaded_without_an_accepted_world(tmp_path: Path) -> None:
    world, why = next_world(tmp_path, _state(), {})
    assert world is None
    assert "no world accepted" in why


def test_a_world_serving_or_judged_already_is_left_as_it_is(tmp_path: Path) -> None:
    worlds = _worlds(tmp_path)
    assert (
        next_world(worlds, _state(stable=NEW), {})[1] == f"world {NEW} already answers every user"
    )
    assert (
        next_world(worlds, _state(candidate=NEW), {})[1] == f"world {NEW} is the candidate already"
    )


def test_the_new_world_waits_for_the_verdict_on_another_candidate(tmp_path: Path) -> None:
    world, why = next_world(_worlds(tmp_path), _state(candidate="20261202-x"), {})
    assert world is None
    assert "20261202-x is being judged" in why


def test_a_world_loaded_once_and_rolled_back_is_not_loaded_again(tmp_path: Path) -> None:
    worlds = _worlds(tmp_path)
    (worlds / ADVANCED_FILE).write_text(f'{{"loaded": {{"{NEW}": "2026-12-04 04:00:00"}}}}')
    before = loaded_before(worlds)
    assert before == {NEW: "2026-12-04 04:00:00"}
    world, why = next_world(worlds, _state(), before)
    assert world is None
    assert "rolled back: not again" in why


def test_an_unreadable_record_counts_as_none(tmp_path: Path) -> None:
    (tmp_path / ADVANCED_FILE).write_text("not json")
    assert loaded_before(tmp_path) == {}


def test_advance_names_what_it_lacks_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["release", "world", "advance", "--worlds", str(_worlds(tmp_path))]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--redis-url", "redis://127.0.0.1:1/0", "--model-repository", "m"])
    assert stopped.value.code == 2
    assert "--triton-url" in capsys.readouterr().err
