"""Changing what serves under load: model versions on a real Triton, index and rules on disk.

A Triton of its own runs in explicit model-control mode so that a test can load a second
version into it, as an operator would; Redis and the world are the session's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from recsys_tools.localstack import ManagedProcess, default_triton_env, start_triton
from recsys_tools.model.load import load_versions
from recsys_tools.world.store.identity import install_model
from recsys_tools.world.store.reindex import reindex_beside

from app.core.errors import ConfigError
from app.core.settings import Settings
from app.release.plan import ReleasePlan, in_share, read_plan, write_plan
from app.world.layout import INDEX_FILE, ITEMS_FILE, MANIFEST_FILE
from app.world.stamp import file_digest, read_stamp
from tests.integration.conftest import CONTEXT, PLAIN_RULES, Stack, metric_samples, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOKEN = "release-test-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
USERS = [f"u{n}" for n in range(400)]
LOOPS = 6


@dataclass
class Versioned:
    root: Path
    repository: Path
    url: str
    process: ManagedProcess

    def load_version(self, stack: Stack, version: int) -> None:
        """What an operator does: install the version, then have Triton load it."""
        install_model(stack.world, self.repository, stack.schema.model_name, version)
        loaded = load_versions(self.url, stack.schema.model_name, str(version), timeout_s=60)
        assert loaded.ready == ("1", str(version))  # the two newest, the old one still there

    def unload_version(self, stack: Stack, version: int) -> None:
        shutil.rmtree(self.repository / stack.schema.model_name / str(version))
        loaded = load_versions(self.url, stack.schema.model_name, "1", timeout_s=60)
        assert loaded.ready == ("1",)


@pytest.fixture(scope="module")
def versioned(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Versioned]:
    root = tmp_path_factory.mktemp("release")
    repository = root / "models"
    shutil.copytree(stack.model_repository, repository)
    process, url = start_triton(
        default_triton_env(),
        repository,
        root / "triton",
        [stack.schema.model_name],
        model_control=True,
    )
    try:
        yield Versioned(root, repository, url, process)
    finally:
        process.stop()


@dataclass
class Release:
    """One service's files: the world symlink, the rules and the release file."""

    root: Path
    settings: Settings

    @property
    def plan_file(self) -> Path:
        return self.root / "release.toml"

    @property
    def current(self) -> Path:
        return self.root / "current"

    def point_at(self, world: Path) -> None:
        """Flip the symlink in one rename, as a deployment would."""
        staged = self.root / "current.new"
        staged.unlink(missing_ok=True)
        staged.symlink_to(world)
        staged.replace(self.current)

    def rules_text(self) -> str:
        return (self.root / "rules.toml").read_text()

    def write_rules(self, text: str) -> None:
        staged = self.root / "rules.new"
        staged.write_text(text)
        staged.replace(self.root / "rules.toml")


@pytest.fixture
def release(stack: Stack, versioned: Versioned, tmp_path: Path) -> Release:
    files = Release(
        tmp_path,
        stack.settings(
            triton_url=versioned.url,
            artifacts_dir=tmp_path / "current",
            rules_file=tmp_path / "rules.toml",
            release_file=tmp_path / "release.toml",
            admin_token=TOKEN,
        ),
    )
    files.point_at(stack.world)
    files.write_rules(PLAIN_RULES)
    write_plan(tmp_path / "release.toml", ReleasePlan(stable="1"))
    return files


@pytest_asyncio.fixture(loop_scope="session")
async def api(release: Release) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(release.settings) as client:
        yield client


@dataclass
class Answer:
    started: float
    ended: float
    user_id: str
    status: int
    body: dict[str, Any]


@dataclass
class SteadyLoad:
    """A few callers asking without pause; every answer kept with when it was asked."""

    client: httpx.AsyncClient
    answers: list[Answer] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _caller(self, first: int) -> None:
        n = first
        while not self._stop.is_set():
            user_id = USERS[n % len(USERS)]
            n += LOOPS
            started = time.monotonic()
            response = await self.client.post(
                "/recommend", json={"user_id": user_id, "num_items": 10, "context": CONTEXT}
            )
            self.answers.append(
                Answer(started, time.monotonic(), user_id, response.status_code, response.json())
            )

    async def run_while(self, change: Any) -> Any:
        callers = [asyncio.create_task(self._caller(n)) for n in range(LOOPS)]
        try:
            return await change()
        finally:
            self._stop.set()
            await asyncio.gather(*callers)

    def between(self, after: float, before: float) -> list[Answer]:
        return [a for a in self.answers if a.started > after and a.ended < before]


def _items(answer: Answer) -> set[str]:
    return {item["item_id"] for item in answer.body["items"]}


async def _admin(client: httpx.AsyncClient, action: str) -> dict[str, Any]:
    response = await client.post(f"/admin/{action}", headers=AUTH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _metrics(client: httpx.AsyncClient) -> dict[str, float]:
    return metric_samples((await client.get("/metrics")).text)


async def test_model_index_and_rules_change_under_load_and_each_answer_is_one_release(
    stack: Stack, versioned: Versioned, release: Release, api: httpx.AsyncClient
) -> None:
    served = read_stamp(stack.world)
    assert served is not None
    assert reindex_beside(stack.world, release.root / "world-b", "IVF16,Flat") == served.world_id
    load = SteadyLoad(api)
    marks: dict[str, float] = {}
    reports: dict[str, dict[str, Any]] = {}
    blocked: set[str] = set()

    async def changes() -> None:
        await asyncio.sleep(0.5)
        # Block the items answered most so far: old answers hold them, new ones must not.
        counts = Counter(item for answer in load.answers for item in _items(answer))
        blocked.update(item for item, _ in counts.most_common(5))
        release.point_at(release.root / "world-b")
        listed = ", ".join(f'"{item}"' for item in sorted(blocked))
        release.write_rules(PLAIN_RULES + f"[block]\nitem_ids = [{listed}]\n")
        marks["files"] = time.monotonic()
        reports["files"] = await _admin(api, "reload")
        marks["files_done"] = time.monotonic()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(versioned.load_version, stack, 2)
        write_plan(
            release.plan_file,
            ReleasePlan(stable="1", canary="2", canary_percent=50.0),
        )
        marks["canary"] = time.monotonic()
        reports["canary"] = await _admin(api, "reload")
        marks["canary_done"] = time.monotonic()
        await asyncio.sleep(0.5)
        marks["rollback"] = time.monotonic()
        reports["rollback"] = await _admin(api, "rollback")
        marks["rollback_done"] = time.monotonic()
        await asyncio.sleep(0.3)

    try:
        await load.run_while(changes)
    finally:
        await asyncio.to_thread(versioned.unload_version, stack, 2)

    answers = load.answers
    assert len(answers) > 100
    assert [a.status for a in answers if a.status != 200] == []
    assert [a.body["degraded"] for a in answers if a.body["degraded"]] == []

    # The files: one reload, one new label; every answer wholly from one release.
    old_label = answers[0].body["artifacts"]
    new_label = reports["files"]["artifacts"]
    assert new_label != old_label
    assert {a.body["artifacts"] for a in answers} == {old_label, new_label}
    for answer in answers:
        if answer.body["artifacts"] == new_label:
            assert not _items(answer) & blocked, "a new answer holds an item the new rules block"
            assert answer.ended > marks["files"]
        elif answer.started > marks["files_done"]:
            raise AssertionError("an answer begun after the reload came from the old release")
    old_answers = [a for a in answers if a.body["artifacts"] == old_label]
    assert any(_items(a) & blocked for a in old_answers)  # the rules did change the answers

    # The models: version 2 answers exactly the canary's share, and only while it runs.
    assert reports["canary"]["canary"] == "2"
    assert reports["canary"]["stable"] == "1"
    assert reports["canary"]["generation"] == reports["files"]["generation"] + 1
    during = load.between(marks["canary_done"], marks["rollback"])
    assert during, "no answer fell inside the canary"
    for answer in during:
        in_canary = in_share(answer.user_id, 50.0)
        expected = ("canary", "2") if in_canary else ("stable", "1")
        model = answer.body["model"]
        assert (model["variant"], model["version"]) == expected, answer.user_id
    assert {a.body["model"]["version"] for a in during} == {"1", "2"}
    for answer in answers:
        if answer.ended < marks["canary"] or answer.started > marks["rollback_done"]:
            assert answer.body["model"] == {
                "name": stack.schema.model_name,
                "version": "1",
                "variant": "stable",
            }

    # The rollback: the stable version alone, here and in the file that other workers and a
    # restart read.
    assert reports["rollback"]["canary"] == ""
    assert read_plan(release.plan_file, "") == ReleasePlan(stable="1")
    metrics = await _metrics(api)
    assert metrics["recsys_model_answers_total{variant=canary}"] == sum(
        1 for a in answers if a.body["model"]["variant"] == "canary"
    )
    assert metrics["recsys_reloads_total{outcome=applied}"] == 3
    assert metrics["recsys_release_generation{}"] == 4
    assert metrics["recsys_canary_percent{}"] == 0


async def test_a_bad_replacement_is_refused_and_the_release_serving_stays(
    stack: Stack, release: Release, api: httpx.AsyncClient
) -> None:
    before = (await _admin(api, "reload"))["artifacts"]
    broken = release.root / "broken"
    reindex_beside(stack.world, broken, "Flat")
    (broken / INDEX_FILE).write_bytes(b"not an index")
    # A damaged catalog, listed so in its manifest (a builder's bug, say).
    corrupt = release.root / "corrupt"
    reindex_beside(stack.world, corrupt, "Flat")
    (corrupt / ITEMS_FILE).unlink()  # a hard link to the served world's: never write through it
    (corrupt / ITEMS_FILE).write_bytes(b"PK\x03\x04 not a whole archive")
    manifest = json.loads((corrupt / MANIFEST_FILE).read_text())
    manifest["files"][ITEMS_FILE] = file_digest(corrupt / ITEMS_FILE)
    (corrupt / MANIFEST_FILE).write_text(json.dumps(manifest))
    cases: dict[str, Callable[[], None]] = {
        "index": lambda: release.point_at(broken),
        "corrupt": lambda: release.point_at(corrupt),
        "rules": lambda: release.write_rules("[diversity]\nmax_per_category = -1\n"),
        "version": lambda: write_plan(
            release.plan_file,
            ReleasePlan(stable="1", canary="7", canary_percent=10.0),
        ),
    }
    expected = {
        "index": "does not belong to world",
        "corrupt": "items.npz cannot be read",
        "rules": "rules file",
        "version": "7",
    }
    for case, damage in cases.items():
        release.point_at(stack.world)
        release.write_rules(PLAIN_RULES)
        write_plan(release.plan_file, ReleasePlan(stable="1"))
        damage()
        response = await api.post("/admin/reload", headers=AUTH)
        assert response.status_code == 409, (case, response.text)
        body = response.json()
        assert body["error"] == "reload_refused"
        assert expected[case] in body["message"], (case, body["message"])
        answer = await api.post("/recommend", json={"user_id": "u3", "context": CONTEXT})
        assert answer.status_code == 200
        assert answer.json()["artifacts"] == before
        assert answer.json()["degraded"] == []
    metrics = await _metrics(api)
    assert metrics["recsys_reloads_total{outcome=refused}"] == len(cases)


async def test_a_shadow_version_scores_beside_and_never_answers(
    stack: Stack, versioned: Versioned, release: Release, api: httpx.AsyncClient
) -> None:
    await asyncio.to_thread(versioned.load_version, stack, 2)
    try:
        write_plan(release.plan_file, ReleasePlan(stable="1", shadow="2"))
        report = await _admin(api, "reload")
        assert (report["stable"], report["shadow"], report["canary"]) == ("1", "2", "")
        for user_id in USERS[:20]:
            response = await api.post("/recommend", json={"user_id": user_id, "context": CONTEXT})
            assert response.json()["model"]["version"] == "1"
        give_up = time.monotonic() + 10
        while (await _metrics(api)).get("recsys_shadow_calls_total{outcome=scored}", 0) < 20:
            assert time.monotonic() < give_up, "the shadow calls never finished"
            await asyncio.sleep(0.05)
        metrics = await _metrics(api)
        # Version 2 is the same model: it agrees on every top item of every request.
        assert metrics["recsys_shadow_agreement_count{}"] == 20
        assert metrics["recsys_shadow_agreement_sum{}"] == 20
        assert metrics["recsys_shadow_agreement_bucket{le=0.99}"] == 0
        assert metrics["recsys_model_version_info{variant=shadow,version=2}"] == 1
    finally:
        await asyncio.to_thread(versioned.unload_version, stack, 2)


async def test_sigusr1_reloads(release: Release, api: httpx.AsyncClient) -> None:
    before = await _admin(api, "reload")
    release.write_rules("[diversity]\nmax_per_category = 3\n")
    os.kill(os.getpid(), signal.SIGUSR1)
    give_up = time.monotonic() + 10
    while True:
        report = (await api.get("/admin/release", headers=AUTH)).json()
        if report["generation"] == before["generation"] + 1:
            break
        assert time.monotonic() < give_up, "SIGUSR1 did not reload"
        await asyncio.sleep(0.05)
    assert report["artifacts"] != before["artifacts"]


async def test_a_reload_that_changes_nothing_says_so(
    release: Release, api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # A comment added to the rules file: the rules as parsed are those served.
    before = await _admin(api, "reload")
    unchanged = (await _metrics(api)).get("recsys_reloads_total{outcome=unchanged}", 0.0)
    release.write_rules(release.rules_text() + "\n# a comment, nothing more\n")
    with caplog.at_level(logging.INFO, logger="app.process.reload"):
        after = await _admin(api, "reload")
    assert after["generation"] == before["generation"]
    metrics = await _metrics(api)
    assert metrics["recsys_reloads_total{outcome=unchanged}"] == unchanged + 1
    said = [r.getMessage() for r in caplog.records]
    assert any("read again are those served" in line for line in said), said


async def test_admin_needs_its_token_and_is_absent_without_one(
    api: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    for headers in (
        {},
        {"authorization": "Bearer wrong-token-0123456789"},
        {"authorization": TOKEN},
    ):
        response = await api.post("/admin/reload", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"
    # The session's service has no token configured: no /admin at all.
    assert (await client.post("/admin/reload", headers=AUTH)).status_code == 404


async def test_loading_needs_a_triton_with_model_control(stack: Stack) -> None:
    with pytest.raises(ConfigError, match="runs without model control: restart it"):
        await asyncio.to_thread(load_versions, stack.triton_url, stack.schema.model_name)
