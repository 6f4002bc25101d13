"""Two worlds side by side, against real Redis and Triton: a candidate world loaded beside the
stable one answers its share of users, refused when it fails a check, rolled back and
promoted by /admin, all under steady traffic with no failed or mixed answer; the promotion
outlives a restart. Redis restarted, or the archive's disk full, during a canary: answers
keep coming, the candidate keeps its share, nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import resource
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from recsys_tools.cli import main
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    start_archive,
    start_redis,
    start_triton,
    unarchived,
)
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world
from recsys_tools.world.store.identity import install_model, model_beside
from recsys_tools.world.store.redis_loader import load_world_into_redis

from app.archive.rows import Kind
from app.archive.store import ArchiveStore
from app.core.events import Event, decode_entry
from app.process import services
from app.process import worlds as worlds_module
from app.release.keyspace import KeySpace
from app.release.worlds import candidate_user, read_worlds
from app.world.stamp import read_stamp
from loadtest.service import start_api
from tests.integration.conftest import Stack, serving
from tests.tools.test_verdict import write_archive

pytestmark = pytest.mark.integration
IN_SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")

TOKEN = "t" * 24
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
WORLD_B = DemoSize(items=1500, users=300, impressions=15_000)
MODEL_B = "ranking_model_b"
PREFIX_B = "recsys-b"
USERS = [f"u{n}" for n in range(120)]
PERCENT = 30.0


@dataclass(frozen=True)
class TwoWorlds:
    stack: Stack
    world_b: Path
    redis_url: str
    triton_url: str
    worlds_file: Path
    a_id: str
    b_id: str
    redis: ManagedProcess

    def settings(self, **overrides: Any) -> Any:
        return self.stack.settings(
            redis_url=self.redis_url,
            triton_url=self.triton_url,
            admin_token=TOKEN,
            worlds_file=self.worlds_file,
            **overrides,
        )

    def candidate_b(self, percent: float = PERCENT, prefix: str = PREFIX_B) -> dict[str, Any]:
        return {
            "artifacts_dir": str(self.world_b),
            "key_prefix": prefix,
            "model_name": MODEL_B,
            "percent": percent,
        }


def _repository(stack: Stack, world_b: Path, root: Path) -> Path:
    """The stack's model, and world B's under a name of its own."""
    name = stack.schema.model_name
    shutil.copytree(stack.model_repository / name, root / name)
    model_beside(root, name, MODEL_B)  # what `recsys install-model --model-name` does
    install_model(world_b, root, MODEL_B)
    return root


@pytest.fixture
def two_worlds(stack: Stack, tmp_path: Path) -> Iterator[TwoWorlds]:
    world_b = tmp_path / "world-b"
    build_demo_world(world_b, stack.schema, WORLD_B, seed=23)
    repository = _repository(stack, world_b, tmp_path / "models")
    started: list[ManagedProcess] = []
    try:
        # Durable as deployed (every write on disk before its answer): a restart loses
        # nothing acknowledged.
        redis_process, redis_url = start_redis(
            tmp_path / "redis", extra=["--appendonly", "yes", "--appendfsync", "always"]
        )
        started.append(redis_process)
        client = redis.Redis.from_url(redis_url)
        try:
            load_world_into_redis(stack.world, client, stack.schema, KeySpace("recsys"))
            load_world_into_redis(world_b, client, stack.schema, KeySpace(PREFIX_B))
        finally:
            client.close()
        triton, triton_url = start_triton(
            default_triton_env(),
            repository,
            tmp_path / "triton",
            [stack.schema.model_name, MODEL_B],
        )
        started.append(triton)
        a, b = read_stamp(stack.world), read_stamp(world_b)
        assert a is not None
        assert b is not None
        yield TwoWorlds(
            stack,
            world_b,
            redis_url,
            triton_url,
            tmp_path / "worlds.toml",
            a.world_id,
            b.world_id,
            redis_process,
        )
    finally:
        for process in reversed(started):
            process.stop()


@dataclass
class Answer:
    at: float  # when the request was sent
    user: str
    status: int
    world: str
    role: str
    degraded: list[str]
    items: list[str]
    answer_id: str = ""


async def _traffic(client: httpx.AsyncClient, answers: Answers, stop: asyncio.Event) -> None:
    """Four callers, one user after another, until told to stop."""

    async def caller(k: int) -> None:
        n = k
        while not stop.is_set():
            user = USERS[n % len(USERS)]
            n += 4
            began = time.monotonic()
            try:
                response = await client.post("/recommend", json={"user_id": user, "num_items": 10})
                body = response.json()
            except (httpx.HTTPError, ValueError) as exc:  # a failed answer, kept as one
                answers.append(Answer(began, user, 0, repr(exc), "", [], []))
                continue
            world = body.get("world", {})
            answers.append(
                Answer(
                    began,
                    user,
                    response.status_code,
                    world.get("id", ""),
                    world.get("role", ""),
                    body.get("degraded", []),
                    [item["item_id"] for item in body.get("items", [])],
                    body.get("answer_id", ""),
                )
            )

    await asyncio.gather(*(caller(k) for k in range(4)))


class Answers(list[Answer]):
    """The answers as they come, and a wait for more."""

    def __init__(self) -> None:
        super().__init__()
        self.grew = asyncio.Event()

    def append(self, answer: Answer) -> None:
        super().append(answer)
        self.grew.set()


async def _settle(answers: Answers, count: int = 150, timeout_s: float = 60.0) -> float:
    """A moment from which on the answers are the new state's, once `count` more came."""
    since, seen = time.monotonic(), len(answers)
    while len(answers) < seen + count:
        answers.grew.clear()
        try:
            await asyncio.wait_for(answers.grew.wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"no answer for {timeout_s} s; the last: {answers[-3:]}") from None
    return since


def _after(answers: list[Answer], start: float, end: float = float("inf")) -> list[Answer]:
    return [a for a in answers if start < a.at < end]


@IN_SESSION_LOOP
async def test_a_candidate_world_is_served_to_its_share_refused_rolled_back_and_promoted(
    two_worlds: TwoWorlds,
) -> None:
    b_items = {f"i{i}" for i in range(WORLD_B.items)}
    answers = Answers()
    stop = asyncio.Event()
    async with serving(two_worlds.settings()) as client:
        state = (await client.get("/admin/worlds", headers=ADMIN)).json()
        assert (state["stable"], state["candidate"]) == (two_worlds.a_id, "")
        load = asyncio.create_task(_traffic(client, answers, stop))
        try:
            await _settle(answers)

            response = await client.post(
                "/admin/worlds/candidate", json=two_worlds.candidate_b(), headers=ADMIN
            )
            assert response.status_code == 200, response.text
            state = response.json()
            assert (state["candidate"], state["percent"]) == (two_worlds.b_id, PERCENT)
            assert state["memory_bytes"] > 0  # stated before it loaded
            loaded = await _settle(answers, 300)

            # A world whose keys are not in Redis is refused; B serves on.
            refused = await client.post(
                "/admin/worlds/candidate",
                json=two_worlds.candidate_b(prefix="recsys-never-loaded"),
                headers=ADMIN,
            )
            assert refused.status_code == 409, refused.text
            assert "refused" in refused.json()["message"]
            plan = read_worlds(two_worlds.worlds_file)
            assert plan.candidate is not None
            assert plan.candidate.key_prefix == PREFIX_B
            await _settle(answers, 100)

            before_rollback = time.monotonic()
            rolled = await client.post("/admin/worlds/rollback", headers=ADMIN)
            assert rolled.status_code == 200
            assert rolled.json()["candidate"] == ""
            rolled_back = await _settle(answers)

            again = await client.post(
                "/admin/worlds/candidate", json=two_worlds.candidate_b(), headers=ADMIN
            )
            assert again.status_code == 200, again.text
            await _settle(answers, 100)
            promoted = await client.post("/admin/worlds/promote", headers=ADMIN)
            assert promoted.status_code == 200, promoted.text
            assert (promoted.json()["stable"], promoted.json()["candidate"]) == (
                two_worlds.b_id,
                "",
            )
            promotion = await _settle(answers)
            nothing = await client.post("/admin/worlds/promote", headers=ADMIN)
            assert nothing.status_code == 409
        finally:
            stop.set()
            await load

    # Under all of it: no failed answer, none degraded, none mixing the two worlds.
    assert len(answers) > 800
    assert [a for a in answers if a.status != 200 or a.degraded] == []
    for answer in answers:
        assert (answer.world, answer.role) in {
            (two_worlds.a_id, "stable"),
            (two_worlds.b_id, "candidate"),
            (two_worlds.b_id, "stable"),
        }, answer
        if answer.world == two_worlds.b_id:
            assert set(answer.items) <= b_items, answer
    # While B was the candidate: its share of users, each user always in one world.
    during = _after(answers, loaded, before_rollback)
    for answer in during:
        expected = "candidate" if candidate_user(answer.user, PERCENT) else "stable"
        assert answer.role == expected, answer
    assert {a.role for a in during} == {"stable", "candidate"}
    # After the rollback every user was back on A at once; after the promotion, on B.
    assert {a.world for a in _after(answers, rolled_back, rolled_back + 0.3)} == {two_worlds.a_id}
    assert {(a.world, a.role) for a in _after(answers, promotion)} == {(two_worlds.b_id, "stable")}

    # The promotion is in the worlds file: a restart serves B.
    plan = read_worlds(two_worlds.worlds_file)
    assert plan.stable is not None
    assert plan.stable.key_prefix == PREFIX_B
    assert plan.candidate is None
    async with serving(two_worlds.settings()) as client:
        body = (await client.post("/recommend", json={"user_id": "u1", "num_items": 5})).json()
        assert body["world"] == {"id": two_worlds.b_id, "role": "stable"}
        metrics = (await client.get("/metrics")).text
        assert 'recsys_world_answers_total{world="stable"} 1.0' in metrics


async def _post_events(
    client: httpx.AsyncClient, acknowledged: list[str], stop: asyncio.Event
) -> None:
    """A click every few ms; the ids of those the service acknowledged (202)."""
    n = 0
    while not stop.is_set():
        event_id = f"canary-{n}"
        n += 1
        event = {"event_id": event_id, "user_id": USERS[n % len(USERS)], "item_id": "i1"}
        response = await client.post("/events", json={"events": [{**event, "type": "click"}]})
        if response.status_code == 202 and response.json()["accepted"] == 1:
            acknowledged.append(event_id)
        await asyncio.sleep(0.005)


async def _canary_under_load(
    client: httpx.AsyncClient,
    two_worlds: TwoWorlds,
    answers: Answers,
    acknowledged: list[str],
    stop: asyncio.Event,
) -> asyncio.Future[Any]:
    """World B loaded as the candidate, then answers asked and clicks posted until `stop`."""
    loaded = await client.post(
        "/admin/worlds/candidate", json=two_worlds.candidate_b(), headers=ADMIN
    )
    assert loaded.status_code == 200, loaded.text
    return asyncio.gather(_traffic(client, answers, stop), _post_events(client, acknowledged, stop))


def _logged_event_ids(url: str, partitions: int) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        found: set[str] = set()
        for partition in range(partitions):
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(  # type: ignore[assignment]
                KeySpace("recsys").events(partition)
            )
            for _, fields in entries:
                found.update(e.event_id for e in decode_entry(fields) if isinstance(e, Event))
        return found
    finally:
        client.close()


# Each file step of a world's start is made this slow: on the event loop, it would stall
# every request of the world already serving for that long.
SLOW_STEP_S = 0.8
OFF_LOOP_STEPS = (
    (services, "opened_world"),
    (services, "opened_catalog"),
    (services, "with_room"),
    (services, "serving_artifacts"),
    (worlds_module, "checked_memory"),
)


async def _longest_stall(stop: asyncio.Event) -> float:
    """How late the event loop ran a 5 ms timer, at most, until `stop`."""
    longest = 0.0
    while not stop.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.005)
        longest = max(longest, time.monotonic() - before - 0.005)
    return longest


@IN_SESSION_LOOP
async def test_a_candidate_world_loads_off_the_event_loop(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's own world, copied, loaded as the candidate beside itself: every step
    that reads its files runs while the serving world's event loop goes on."""
    calls: dict[str, int] = {}

    def slowed(name: str, step: Any) -> Any:
        def slow(*args: Any, **kwargs: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            time.sleep(SLOW_STEP_S)  # blocks whichever thread runs it
            return step(*args, **kwargs)

        return slow

    copy = tmp_path / "world-copy"
    shutil.copytree(stack.world, copy)
    settings = stack.settings(admin_token=TOKEN, worlds_file=tmp_path / "worlds.toml")
    candidate = {"artifacts_dir": str(copy), "key_prefix": "recsys", "percent": PERCENT}
    async with serving(settings) as client:
        for module, name in OFF_LOOP_STEPS:
            monkeypatch.setattr(module, name, slowed(name, getattr(module, name)))
        stop = asyncio.Event()
        probe = asyncio.create_task(_longest_stall(stop))
        await asyncio.sleep(0)  # the probe's clock runs before the first step can block
        started = time.monotonic()
        response = await client.post("/admin/worlds/candidate", json=candidate, headers=ADMIN)
        took = time.monotonic() - started
        stop.set()
        stall = await probe
    assert response.status_code == 200, response.text
    # Every slowed step ran (a step renamed or moved would leave this test blind to it) ...
    assert set(calls) == {name for _, name in OFF_LOOP_STEPS}, calls
    assert took >= len(OFF_LOOP_STEPS) * SLOW_STEP_S
    # ... and none of them on the loop: one there stalls it a whole step (0.8 s); the rest of
    # the start, a garbage collection, a busy machine stay well under 0.6 s.
    assert stall < SLOW_STEP_S - 0.2, (stall, took)


@IN_SESSION_LOOP
async def test_redis_restarted_during_a_canary_loses_no_answer_and_no_acknowledged_event(
    two_worlds: TwoWorlds,
) -> None:
    answers = Answers()
    acknowledged: list[str] = []
    stop = asyncio.Event()
    settings = two_worlds.settings()
    async with serving(settings) as client:
        load = await _canary_under_load(client, two_worlds, answers, acknowledged, stop)
        try:
            await _settle(answers)
            await asyncio.to_thread(two_worlds.redis.restart)  # killed, then up from its log
            # Past the breakers' open time, the next answers are whole again.
            await asyncio.sleep(settings.breaker_open_s + 1.0)
            back = await _settle(answers, 200)
            state = (await client.get("/admin/worlds", headers=ADMIN)).json()
        finally:
            stop.set()
            await load
    # Answers kept coming from both worlds through it, the candidate kept its share, and
    # once Redis was back they were whole again.
    assert [a for a in answers if a.status != 200] == []
    assert (state["candidate"], state["percent"]) == (two_worlds.b_id, PERCENT)
    recovered = _after(answers, back)
    assert {a.role for a in recovered} == {"stable", "candidate"}
    assert [a for a in recovered if a.degraded] == []
    # Every event the service acknowledged is in the event log after the restart.
    logged = _logged_event_ids(two_worlds.redis_url, settings.event_partitions)
    assert len(acknowledged) > 50
    assert set(acknowledged) <= logged


def _archived_all(url: str, partitions: int, archive: ManagedProcess) -> None:
    give_up = time.monotonic() + 120.0  # generous: a slow, busy machine
    while _unarchived(url, partitions) > 0:
        assert time.monotonic() < give_up, archive.log_tail()
        time.sleep(0.2)


def _parts(root: Path) -> set[Path]:
    return set(root.rglob("part-*.parquet"))


def _unarchived(url: str, partitions: int) -> int:
    client = redis.Redis.from_url(url)
    try:
        return unarchived(client, KeySpace("recsys"), partitions)
    finally:
        client.close()


@IN_SESSION_LOOP
async def test_the_archives_disk_full_during_a_canary_holds_the_candidate_and_loses_nothing(
    two_worlds: TwoWorlds, tmp_path: Path
) -> None:
    settings = two_worlds.settings()
    root = tmp_path / "archive"
    archive = start_archive(
        {
            "RECSYS_REDIS_URL": two_worlds.redis_url,
            "RECSYS_EVENT_PARTITIONS": str(settings.event_partitions),
            "RECSYS_ARCHIVE_URI": str(root),
            "RECSYS_ARCHIVE_FLUSH_S": "0.3",
        },
        tmp_path / "archive-process",
    )
    answers, stop = Answers(), asyncio.Event()
    acknowledged: list[str] = []
    try:
        async with serving(settings) as client:
            load = await _canary_under_load(client, two_worlds, answers, acknowledged, stop)
            try:
                await _settle(answers)
                # No room left for the archive: each file it writes fails as on a full disk
                # (EFBIG where ENOSPC would be; the same OSError to it). Its own log is a file
                # too, so what it says is lost: Redis and the folder tell instead.
                _, hard = resource.prlimit(archive.pid, resource.RLIMIT_FSIZE)
                resource.prlimit(archive.pid, resource.RLIMIT_FSIZE, (0, hard))
                await asyncio.sleep(1.0)  # a write under way when the disk filled, done
                files = _parts(root)
                full = await _settle(answers)
                await _settle(answers)
                during = _after(answers, full)
                assert _parts(root) == files  # nothing written while full...
                waiting = _unarchived(two_worlds.redis_url, settings.event_partitions)
                assert waiting > 0  # ...and nothing acknowledged: the streams hold it
                state = (await client.get("/admin/worlds", headers=ADMIN)).json()
                resource.prlimit(archive.pid, resource.RLIMIT_FSIZE, (hard, hard))
                await _settle(answers, 100)
            finally:
                stop.set()
                await load
        await asyncio.to_thread(
            _archived_all, two_worlds.redis_url, settings.event_partitions, archive
        )
        assert archive.running()
    finally:
        archive.stop()
    # The API never noticed: whole answers from both worlds, the candidate kept its share.
    assert [a for a in answers if a.status != 200] == []
    assert {a.role for a in during} == {"stable", "candidate"}
    assert [a for a in during if a.degraded] == []
    assert (state["candidate"], state["percent"]) == (two_worlds.b_id, PERCENT)
    # Room again, the archive caught up: every acknowledged event, and every answer given.
    store = ArchiveStore(str(root))
    archived = set(store.read(Kind.EVENTS).column("event_id").to_pylist())
    assert len(acknowledged) > 50
    assert set(acknowledged) <= archived
    logged = store.read(Kind.ANSWERS)
    assert {a.answer_id for a in answers} <= set(logged.column("answer_id").to_pylist())
    assert set(logged.column("world_id").to_pylist()) == {two_worlds.a_id, two_worlds.b_id}


def test_a_world_is_staged_under_its_id(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recsys release world stage`: its keys under recsys-ID, its model beside the first."""
    name = stack.schema.model_name
    shutil.copytree(stack.model_repository / name, tmp_path / "models" / name)
    process, url = start_redis(tmp_path / "redis")
    try:
        argv = ["release", "world", "stage", "--world", str(stack.world), "--redis-url", url]
        assert main([*argv, "--model-repository", str(tmp_path / "models")]) == 0
        stamp = read_stamp(stack.world)
        assert stamp is not None
        prefix, model = f"recsys-{stamp.world_id}", f"{name}_{stamp.world_id.replace('-', '_')}"
        client = redis.Redis.from_url(url)
        assert client.hgetall(f"{prefix}:meta")
        client.close()
        config = (tmp_path / "models" / model / "config.pbtxt").read_text()
        assert f'name: "{model}"' in config
        assert stamp.world_id in config  # the model carries its world's id
        said = capsys.readouterr().out
        assert f"--prefix {prefix} --model {model}" in said
    finally:
        process.stop()


@IN_SESSION_LOOP
async def test_the_judge_acts_on_a_real_service_promoting_rolling_back_or_waiting(
    two_worlds: TwoWorlds, tmp_path: Path
) -> None:
    """`recsys release judge --act`, as the hourly timer runs it, against the API as its own
    process: each verdict read from an archive of the two worlds' answers, and carried out
    as /admin/worlds says afterwards."""
    env = {
        "RECSYS_REDIS_URL": two_worlds.redis_url,
        "RECSYS_TRITON_URL": two_worlds.triton_url,
        "RECSYS_ARTIFACTS_DIR": str(two_worlds.stack.world),
        "RECSYS_ADMIN_TOKEN": TOKEN,
        "RECSYS_WORLDS_FILE": str(two_worlds.worlds_file),
    }
    api = await asyncio.to_thread(start_api, env, tmp_path / "api.log")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    arms = (two_worlds.a_id, two_worlds.b_id)

    async def judged(name: str, clicks: tuple[float, float], answers: int) -> dict[str, Any]:
        archive = tmp_path / name
        write_archive(archive, dict(zip(arms, clicks, strict=True)), answers, worlds=arms)
        argv = ["release", "judge", "--archive", str(archive), "--act", "--url", api.url]
        assert await asyncio.to_thread(main, [*argv, "--token-file", str(token_file)]) == 0
        shown: dict[str, Any] = (await admin.get("/admin/worlds")).json()
        return shown

    try:
        async with httpx.AsyncClient(base_url=api.url, headers=ADMIN, timeout=60.0) as admin:
            loaded = await admin.post("/admin/worlds/candidate", json=two_worlds.candidate_b())
            assert loaded.status_code == 200, loaded.text
            # Too few answers to tell: the candidate keeps its share.
            waited = await judged("wait", (0.1, 0.3), 200)
            assert (waited["stable"], waited["candidate"]) == arms
            # Clearly worse: rolled back, the stable world answers everyone.
            rolled = await judged("worse", (0.2, 0.1), 20_000)
            assert (rolled["stable"], rolled["candidate"]) == (two_worlds.a_id, "")
            again = await admin.post("/admin/worlds/candidate", json=two_worlds.candidate_b())
            assert again.status_code == 200, again.text
            # Clearly better: promoted, world B answers everyone.
            promoted = await judged("better", (0.1, 0.2), 20_000)
            assert (promoted["stable"], promoted["candidate"]) == (two_worlds.b_id, "")
    finally:
        await asyncio.to_thread(api.stop)
