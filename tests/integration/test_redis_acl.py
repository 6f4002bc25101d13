"""The deployment's Redis users (deploy/quadlet/redis-users.acl) on a real redis-server.

The service logs in as recsys-api and can read the feature store and nothing else; the
loader can write it but not flush it, run scripts or change the server; nobody gets in
without a user.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio
from recsys_tools.localstack import (
    ManagedProcess,
    start_archive,
    start_ingest,
    start_redis,
)
from recsys_tools.world.store.redis_loader import load_world_into_redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from app.archive.rows import Kind
from app.archive.store import ArchiveStore
from app.clients.catalog_compactor import compact
from app.clients.catalog_log import CatalogLog
from app.release.keyspace import KeySpace
from app.world.stamp import read_stamp
from tests.debian_tools import redis_7
from tests.integration.conftest import CONTEXT, Stack, serving

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ACL_TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "quadlet" / "redis-users.acl"
PASSWORDS = {
    "API": "api-password",
    "LOADER": "loader-password",
    "HEALTH": "health-password",
    "INGEST": "ingest-password",
    "ARCHIVE": "archive-password",
}
# What a stolen login of the service's, or of the loader's, must not be able to do.
FORBIDDEN = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("EVAL", "return 1", "0"),
    ("CONFIG", "SET", "dir", "/tmp"),
    ("KEYS", "*"),
    ("DEBUG", "SLEEP", "0"),
    ("SHUTDOWN",),
]


def acl_file(folder: Path) -> Path:
    """The shipped template with the passwords' SHA-256, as the install steps fill it."""
    text = ACL_TEMPLATE.read_text()
    for role, password in PASSWORDS.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        text = text.replace(f"{role}_PASSWORD_SHA256", digest)
    assert "PASSWORD" not in text
    # Debian 12's Redis is 7.0, before CLIENT SETINFO (7.2, what the deployment runs): the
    # one permission it would refuse as unknown. redis-py's SETINFO on connect, refused,
    # is ignored by the client.
    text = text.replace(" +client|setinfo", "")
    path = folder / "users.acl"
    path.write_text(text)
    return path


def _redis_with_users(folder: Path) -> tuple[ManagedProcess, str]:
    server, env = redis_7()
    return start_redis(
        folder / "redis", extra=["--aclfile", str(acl_file(folder))], server=server, env=env
    )


def _refused(client: redis.Redis, command: tuple[str, ...]) -> bool:
    try:
        client.execute_command(*command)  # type: ignore[no-untyped-call]
    except (NoPermissionError, ResponseError) as exc:
        said = str(exc).lower()
        # Redis 7 refuses DEBUG to everyone unless enable-debug-command allows it.
        return "permission" in said or "debug command not allowed" in said
    return False


async def test_each_user_can_do_its_job_and_nothing_more(stack: Stack, tmp_path: Path) -> None:
    process, url = _redis_with_users(tmp_path)
    try:
        loader = redis.Redis.from_url(url, username="recsys-loader", password=PASSWORDS["LOADER"])
        load_world_into_redis(stack.world, loader, stack.schema, KeySpace("recsys"))
        settings = stack.settings(
            redis_url=url, redis_username="recsys-api", redis_password=PASSWORDS["API"]
        )
        async with serving(settings) as api:
            answer = await api.post(
                "/recommend", json={"user_id": "u3", "num_items": 5, "context": CONTEXT}
            )
            ready = await api.get("/readyz")
        service = redis.Redis.from_url(url, username="recsys-api", password=PASSWORDS["API"])
        health = redis.Redis.from_url(url, username="recsys-health", password=PASSWORDS["HEALTH"])
        anyone = redis.Redis.from_url(url)
        assert answer.json()["degraded"] == []
        assert ready.json()["checks"]["redis"] is True
        for command in FORBIDDEN:
            assert _refused(service, command), command
            assert _refused(loader, command), command
        # The service reads the features and appends events: it can delete, rewrite a
        # layout or a list, or run a script on nothing (SET it has, for its answer notes).
        for write in (
            ("DEL", "recsys:u:{u3}"),
            ("HSET", "recsys:meta", "a", "b"),
            ("SET", "recsys:u:{u3}", "x"),
            ("SET", "recsys:meta", "x"),
            ("XADD", "recsys:dead:{0}", "*", "a", "b"),
        ):
            assert _refused(service, write), write
        assert not _refused(service, ("SET", "recsys:ans:0123", "stable"))
        assert _refused(service, ("APPEND", "recsys:seen:{u3}", "x"))
        assert _refused(service, ("GET", "elsewhere:key"))  # and only its own keys
        # A world served beside the first, under recsys-NAME: the same rights on its keys.
        load_world_into_redis(stack.world, loader, stack.schema, KeySpace("recsys-next"))
        assert service.hgetall("recsys-next:meta")
        assert _refused(service, ("DEL", "recsys-next:u:{u3}"))
        assert not _refused(service, ("HSET", "recsys-next:i:x", "a", "b"))
        assert _refused(service, ("GET", "recsysnext:meta"))
        assert health.ping()
        assert _refused(health, ("GET", "recsys:meta"))
        with pytest.raises(AuthenticationError):
            anyone.ping()
        for client in (loader, service, health, anyone):
            client.close()
    finally:
        process.stop()


async def test_events_flow_through_the_api_and_consumer_users(stack: Stack, tmp_path: Path) -> None:
    process, url = _redis_with_users(tmp_path)
    consumer = archive = None
    try:
        loader = redis.Redis.from_url(url, username="recsys-loader", password=PASSWORDS["LOADER"])
        load_world_into_redis(stack.world, loader, stack.schema, KeySpace("recsys"))
        consumer = start_ingest(
            {
                "RECSYS_REDIS_URL": url,
                "RECSYS_REDIS_USERNAME": "recsys-ingest",
                "RECSYS_REDIS_PASSWORD": PASSWORDS["INGEST"],
                "RECSYS_ARTIFACTS_DIR": str(stack.world),
            },
            tmp_path / "ingest",
        )
        archive = start_archive(
            {
                "RECSYS_REDIS_URL": url,
                "RECSYS_REDIS_USERNAME": "recsys-archive",
                "RECSYS_REDIS_PASSWORD": PASSWORDS["ARCHIVE"],
                "RECSYS_ARCHIVE_URI": str(tmp_path / "archive"),
                "RECSYS_ARCHIVE_FLUSH_S": "0.2",
            },
            tmp_path / "archive-process",
        )
        settings = stack.settings(
            redis_url=url, redis_username="recsys-api", redis_password=PASSWORDS["API"]
        )
        body = {"user_id": "u3", "num_items": 5, "context": CONTEXT}
        async with serving(settings) as api:
            first = (await api.post("/recommend", json=body)).json()["items"][0]["item_id"]
            event = {"event_id": "e1", "user_id": "u3", "item_id": first, "type": "purchase"}
            posted = await api.post("/events", json={"events": [event]})
            assert posted.status_code == 202, posted.text
            give_up = time.monotonic() + 20.0
            while first in [
                i["item_id"] for i in (await api.post("/recommend", json=body)).json()["items"]
            ]:
                assert time.monotonic() < give_up, consumer.log_tail()
                await asyncio.sleep(0.05)
            # An item added while serving, then liked: the consumer, as its own user, counts
            # the like for exploration and refits the item's vector through the change log.
            new = {"item_id": "acl-new", "categories": await _categories_of(api, first)}
            added = await api.post("/catalog/items", json={"items": [new]})
            assert added.status_code == 200, added.text
            like = {"event_id": "e2", "user_id": "u3", "item_id": "acl-new", "type": "like"}
            assert (await api.post("/events", json={"events": [like]})).status_code == 202
            while (await api.get("/catalog")).json()["batch"] < 2:
                assert time.monotonic() < give_up, consumer.log_tail()
                await asyncio.sleep(0.05)
            # The log compacted by the API's user: each command of its scripts is allowed.
            held = (await api.get("/catalog")).json()
            assert await _compacted_as_the_api(stack, url)
            assert (await api.get("/catalog")).json() == held
        assert "not refitted" not in consumer.log_tail()
        # The archive, as its own user, keeps both events and the answers the API logged.
        archived = ArchiveStore(str(tmp_path / "archive"))
        while archived.read(Kind.EVENTS).num_rows < 2 or archived.read(Kind.ANSWERS).num_rows < 3:
            assert time.monotonic() < give_up + 20.0, archive.log_tail()
            await asyncio.sleep(0.1)
        assert set(archived.read(Kind.EVENTS).column("event_id").to_pylist()) == {"e1", "e2"}
        assert "NOPERM" not in archive.log_tail(100)
        keeper = redis.Redis.from_url(url, username="recsys-archive", password=PASSWORDS["ARCHIVE"])
        for command in (*FORBIDDEN, ("GET", "recsys:u:{u3}"), ("HGETALL", "recsys:meta")):
            assert _refused(keeper, command), command
        keeper.close()
        ingest = redis.Redis.from_url(url, username="recsys-ingest", password=PASSWORDS["INGEST"])
        for command in FORBIDDEN:  # EVAL too: its own script runs by digest (EVALSHA)
            assert _refused(ingest, command), command
        # Only the key families it keeps: not the layout, the items or the answer notes.
        for write in (
            ("HSET", "recsys:meta", "world_id", "x"),
            ("SET", "recsys:i:i1", "x"),
            ("SET", "recsys:ans:0123", "canary"),
            ("SET", "elsewhere:key", "x"),
        ):
            assert _refused(ingest, write), write
        ingest.close()
        loader.close()
    finally:
        if consumer is not None:
            consumer.stop()
        if archive is not None:
            archive.stop()
        process.stop()


async def _categories_of(api: httpx.AsyncClient, item: str) -> list[str]:
    body = {"user_id": "u3", "num_items": 50, "context": CONTEXT, "attributes": ["categories"]}
    items = (await api.post("/recommend", json=body)).json()["items"]
    named = {i["item_id"]: i["attributes"]["categories"] for i in items}
    return str(named.get(item) or items[0]["attributes"]["categories"]).split("|")


async def _compacted_as_the_api(stack: Stack, url: str) -> bool:
    stamp = read_stamp(stack.world)
    assert stamp is not None
    client = redis.asyncio.Redis.from_url(url, username="recsys-api", password=PASSWORDS["API"])
    try:
        return await compact(CatalogLog(client, KeySpace("recsys"), stamp.world_id), _any, 10.0)
    finally:
        await client.aclose()


def _any(batch: object) -> None:
    """Every batch may be folded."""
