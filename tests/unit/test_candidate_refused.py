"""A candidate world whose files are broken is refused at start-up, however its readers fail:
logged, counted, and the stable world serves everyone; a stable world's own faults still
raise."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from app.core.metrics import ServiceMetrics
from app.core.outcomes import ReloadOutcome, WorldChange
from app.core.settings import Settings
from app.core.vocabulary import WorldRole
from app.process import worlds as worlds_module
from app.process.services import Services, start_services
from app.process.worlds import Worlds, _Serving, open_worlds
from app.release.worlds import WorldRef, WorldsPlan, write_worlds
from app.world.layout import ITEMS_FILE, MANIFEST_FILE, SCHEMA_FILE

# Each as a retrain job, a full disk or a bad copy could leave it; the service's readers
# meet the first two in a library's own error (UnicodeDecodeError, AttributeError), the
# third in one of ours.
CORRUPTIONS = {
    "a schema that is not UTF-8": (SCHEMA_FILE, b"\x84\xff{}"),
    "a manifest that is not an object": (MANIFEST_FILE, b"[1, 2]"),
    "a truncated item table": (ITEMS_FILE, b"PK\x03\x04\x14\x00"),
}


async def _no_close() -> None:
    return None


def _stable(settings: Settings) -> Services:
    # Only what open_worlds and the report read of a started world.
    return cast(
        Services,
        SimpleNamespace(settings=settings, served=SimpleNamespace(stamp=None), aclose=_no_close),
    )


@pytest.fixture(autouse=True)
def _no_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stable world here is a stand-in with no clients to refresh.
    monkeypatch.setattr(worlds_module, "world_tasks", lambda services, stable=True: [])


def _refused(metrics: ServiceMetrics, action: WorldChange) -> float:
    value: float = metrics.world_change_count[(action, ReloadOutcome.REFUSED)]._value.get()
    return value


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
async def test_a_broken_candidate_is_refused_and_the_stable_world_serves_alone(
    tmp_path: Path, corruption: str, caplog: pytest.LogCaptureFixture
) -> None:
    name, content = CORRUPTIONS[corruption]
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / name).write_bytes(content)
    worlds_file = tmp_path / "worlds.toml"
    ref = WorldRef(candidate, "recsys-next", "ranking_model_next")
    write_worlds(worlds_file, WorldsPlan(candidate=ref, percent=50.0))
    base = Settings(artifacts_dir=tmp_path / "stable", worlds_file=worlds_file)
    metrics = ServiceMetrics(CollectorRegistry())

    async def start(settings: Settings) -> Services:
        if settings.artifacts_dir == base.artifacts_dir:
            return _stable(settings)
        # The service's own start-up: the candidate's files fail before any client is made.
        return await start_services(settings, metrics)

    with caplog.at_level(logging.ERROR):
        worlds = await open_worlds(base, metrics, start)
    assert worlds.candidate is None
    assert _refused(metrics, WorldChange.LOAD) == 1
    assert {worlds.serving(f"user-{n}")[1] for n in range(100)} == {WorldRole.STABLE}
    assert f"world {ref.said()} refused" in caplog.text
    await worlds.aclose()


async def test_a_stable_worlds_own_fault_is_not_taken_for_a_refusal(tmp_path: Path) -> None:
    base = Settings(artifacts_dir=tmp_path / "stable")
    metrics = ServiceMetrics(CollectorRegistry())
    other = tmp_path / "other"
    other.mkdir()

    async def start(settings: Settings) -> Services:
        raise AttributeError("a bug in start-up")

    worlds = Worlds(base, metrics, start, _Serving(_stable(base), None, []))
    with pytest.raises(AttributeError, match="a bug"):
        await worlds.converge(WorldsPlan(stable=WorldRef(other, "recsys-other")))
    assert _refused(metrics, WorldChange.PROMOTE) == 0
    assert worlds.stable.ref is None  # what served still does
