"""Model inputs through shared memory: the same answers, and no region left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.clients.shared_memory import PREFIX, SHM_DIR, remove_stale_regions
from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = pytest.mark.integration
USERS = ("u1", "u7", "u42", "u123", "nobody")


def _regions() -> set[str]:
    return {path.name for path in SHM_DIR.glob(f"{PREFIX}{os.getpid()}-*")}


async def _answers(stack: Stack, shared: bool) -> tuple[list[Any], set[str]]:
    mode = "on" if shared else "off"
    settings = stack.settings(triton_shared_memory=mode, rules_file=stack.plain_rules)
    before = _regions()  # the session's other apps have their own
    async with serving(settings) as api:
        regions = _regions() - before
        answers = []
        for user in USERS:
            body = {"user_id": user, "num_items": 10, "context": CONTEXT}
            answer = (await api.post("/recommend", json=body)).json()
            answers.append((answer["items"], answer["degraded"]))
    return answers, regions


async def test_answers_through_shared_memory_are_the_same(stack: Stack) -> None:
    before = _regions()
    shared, regions = await _answers(stack, True)
    plain, none = await _answers(stack, False)
    assert shared == plain
    assert all(degraded == [] for _, degraded in shared)
    assert len(regions) == 1  # one endpoint, one region
    assert none == set()
    assert _regions() == before  # removed at shutdown


def test_regions_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}999999999-abcd"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-abcd"
    other = tmp_path / "someone-else"
    for path in (dead, mine, other):
        path.write_bytes(b"")
    assert remove_stale_regions(tmp_path) == [dead.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])
