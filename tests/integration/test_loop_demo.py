"""The whole loop on real Redis, Triton, API, recsys-ingest and recsys-archive processes: a
week of drifting traffic archived, a retrain on it, the new world canaried beside the
serving one, today's traffic judged from the archive, and the verdict acted on."""

from __future__ import annotations

from pathlib import Path

import pytest
from recsys_tools.loop_demo import LoopOptions, run_loop
from recsys_tools.world.generate.drift import DailyShape
from recsys_tools.world_advance import loaded_before

from app.release.worlds import read_worlds

pytestmark = pytest.mark.integration

# Small enough to build in seconds; drifting enough that the week matters.
SHAPE = DailyShape(groups=8, items_per_group=60, users=400, history_days=12, later_days=4)


def test_the_loop_runs_from_traffic_to_a_verdict_acted_on(tmp_path: Path) -> None:
    said: list[str] = []
    options = LoopOptions(tmp_path / "loop", SHAPE, percent=30.0, min_answers=50, margin=0.5)
    cycle = run_loop(options, said.append)
    assert len(said) == 8, said  # every step said, in order
    assert said[2].startswith("Posted the last 4 days'")
    assert "accepted" in said[3], said[3]
    # Loaded by `recsys release world advance`, which keeps what it loaded.
    (candidate_id,) = loaded_before(options.folder / "worlds")
    assert said[4].startswith(f"Loaded: world {cycle_stable(said)}"), said[4]
    assert f"candidate world {candidate_id}" in said[4], said[4]
    # Today's traffic reached both worlds, and no answer failed or degraded.
    assert cycle.failed_answers == 0, said[5]
    assert cycle.answers.get("candidate", 0) > 0, said[5]
    assert cycle.answers.get("stable", 0) > cycle.answers["candidate"], said[5]
    assert cycle.verdict in {"promote", "roll back", "wait"}, said[6]
    plan = read_worlds(options.folder / "worlds.toml")
    if cycle.verdict == "promote":
        assert plan.stable is not None
        assert plan.candidate is None
        assert cycle.final_world == candidate_id
    elif cycle.verdict == "roll back":
        assert plan.candidate is None
        assert cycle.final_world != candidate_id
    else:
        assert plan.candidate is not None


def cycle_stable(said: list[str]) -> str:
    """The serving world's id, as the build step said it."""
    return said[1].split("serving world ")[1].split()[0]
