"""Redis as the feature store: one packed FP32 blob per user and per item.

Keys: `{prefix}:u:{user_id}` and `{prefix}:i:{item_id}` hold blobs in the schema's layouts,
`{prefix}:seen:{user_id}` every item the user has seen, and `{prefix}:meta` the layout the
data was written with, checked once at start-up.

A seen list is a string of little-endian uint32 catalog positions, oldest first: a history
of any length is read in one GET and decoded without a per-item step, and a new item is one
APPEND. Positions are those of the world the data was loaded from, which the layout record
names; within a world, reloads keep the items and their order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from app.clients.breaker import CircuitBreaker
from app.core.errors import FailureKind, FeatureStoreError, SchemaError
from app.core.settings import Settings
from app.core.vocabulary import Positions
from app.release.keyspace import USER_KEYS_FORMAT, KeySpace
from app.world.schema import FeatureSchema

FLOAT32 = np.dtype("<f4")
SEEN_POSITION = np.dtype("<u4")
# The layout record's value for seen lists as they are written now.
SEEN_FORMAT = "positions-u32le"
RedisClient = aioredis.Redis | RedisCluster
MGET_CHUNK = 500
# A Redis Cluster client's socket timeout: a backstop far beyond any call's own deadline.
CLUSTER_SOCKET_TIMEOUT_S = 5.0


# The layout record's field naming the world the data came from (written by the loader).
WORLD_ID_FIELD = "world_id"
# A new value after every complete load of the item blobs, for readers that hold them.
ITEMS_VERSION_FIELD = "items_version"


def layout_meta(schema: FeatureSchema) -> dict[str, str]:
    """What the writer records about the blobs, so a reader can refuse a different layout."""
    return {
        "schema_version": str(schema.version),
        "embedding_dim": str(schema.embedding_dim),
        "user_dense": ",".join(schema.user_dense),
        "item_dense": ",".join(schema.item_dense),
        "seen_format": SEEN_FORMAT,
        "user_keys": USER_KEYS_FORMAT,
    }


def encode_seen(positions: npt.ArrayLike) -> bytes:
    """Catalog positions as a seen list stores them (appendable: concatenation is a list)."""
    return np.asarray(positions, dtype=SEEN_POSITION).tobytes()


def decode_seen(raw: bytes | None) -> tuple[Positions, bool]:
    """The positions in a stored seen list, and whether it was whole (a multiple of 4 bytes)."""
    if not raw:
        return np.empty(0, dtype=np.int64), True
    whole = len(raw) - len(raw) % SEEN_POSITION.itemsize
    positions = np.frombuffer(raw[:whole], dtype=SEEN_POSITION).astype(np.int64)
    return positions, whole == len(raw)


class BlobState(Enum):
    PRESENT = "present"
    ABSENT = "absent"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class UserRecord:
    """The user's blob (None unless PRESENT), the catalog positions of the items they have
    seen, and whether their seen list was whole (False: a torn write, its tail dropped)."""

    blob: npt.NDArray[np.float32] | None
    state: BlobState
    seen: Positions
    seen_whole: bool = True
    recent: Positions = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # The number of the change log's last batch that withdrew, read with the user (0: none,
    # or not read): a request applies the log up to it before it answers.
    catalog_seq: int = 0


@dataclass(frozen=True, slots=True)
class ItemBlobs:
    """Blobs of the items that had well-formed ones, stacked; the others by index.

    `found` and `malformed` index into the requested keys; a key in neither has no blob.
    """

    found: npt.NDArray[np.intp]
    matrix: npt.NDArray[np.float32]
    malformed: npt.NDArray[np.intp]


def decode_item_blobs(values: Sequence[bytes | None], width: int) -> ItemBlobs:
    """Stack the blobs of length `width` floats into one matrix with a single frombuffer."""
    nbytes = width * FLOAT32.itemsize
    valid = [i for i, value in enumerate(values) if value is not None and len(value) == nbytes]
    malformed = [i for i, value in enumerate(values) if value is not None and len(value) != nbytes]
    raw = b"".join(values[i] or b"" for i in valid)
    matrix = np.frombuffer(raw, dtype=FLOAT32).reshape(len(valid), width)
    return ItemBlobs(np.asarray(valid, dtype=np.intp), matrix, np.asarray(malformed, dtype=np.intp))


def decode_user(
    blob: bytes | None,
    seen: bytes | None,
    width: int,
    recent: bytes | None = None,
    catalog_seq: int = 0,
) -> UserRecord:
    """The user's record; a blob of the wrong size is MALFORMED, not a missing user.

    `recent` is the tail of the user's positives (oldest first), in the seen list's format.
    """
    positions, whole = decode_seen(seen)
    latest, _ = decode_seen(recent)
    if blob is None:
        return UserRecord(None, BlobState.ABSENT, positions, whole, latest, catalog_seq)
    if len(blob) != width * FLOAT32.itemsize:
        return UserRecord(None, BlobState.MALFORMED, positions, whole, latest, catalog_seq)
    vector = np.frombuffer(blob, dtype=FLOAT32)
    return UserRecord(vector, BlobState.PRESENT, positions, whole, latest, catalog_seq)


def as_text(value: bytes | str) -> str:
    # The layout record is written by our loader, but Redis holds whatever was put there:
    # bytes that are not UTF-8 must read as a mismatch, never as a crash.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def failure_kind(exc: BaseException) -> FailureKind:
    """What a Redis client error says about Redis (a metric label)."""
    if isinstance(exc, redis_errors.TimeoutError | TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, redis_errors.ConnectionError | OSError):
        return FailureKind.UNAVAILABLE
    return FailureKind.ERROR


@asynccontextmanager
async def redis_call(operation: str, timeout_s: float) -> AsyncIterator[None]:
    """Bound one call, the wait for a pooled connection included, and map its errors."""
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except (redis_errors.RedisError, OSError, TimeoutError) as exc:
        raise FeatureStoreError(
            failure_kind(exc), f"{operation}: {type(exc).__name__} {exc}"
        ) from exc


def _require_time(timeout_s: float) -> None:
    # A request that has spent its budget must not count against Redis's breaker.
    if timeout_s <= 0:
        raise FeatureStoreError(FailureKind.TIMEOUT, "no time left before the deadline")


class FeatureStore:
    """Reads user and item features; owns nothing but the Redis client it is given.

    Every read carries its own timeout and goes through the Redis circuit breaker.
    """

    def __init__(
        self,
        client: RedisClient,
        schema: FeatureSchema,
        keys: KeySpace,
        breaker: CircuitBreaker,
        recent_items: int = 0,
        catalog_seq_key: str | None = None,
    ) -> None:
        self._client = client
        self._schema = schema
        self._keys = keys
        self._breaker = breaker
        # The tail of the positives list read with the user: SEEN_POSITION bytes an item.
        self._recent_bytes = recent_items * SEEN_POSITION.itemsize
        self.catalog_seq_key = catalog_seq_key

    @property
    def keys(self) -> KeySpace:
        return self._keys

    @property
    def client(self) -> RedisClient:
        """The pooled client, for the event log and the trending reader beside the store."""
        return self._client

    async def user(self, user_id: str, timeout_s: float) -> UserRecord:
        """The user's blob, every item they have seen and their latest positives, in one
        round trip."""
        _require_time(timeout_s)
        with self._breaker.guard(FeatureStoreError):
            async with redis_call("read user", timeout_s):
                # One pipeline: one round trip, to a single Redis or a Cluster alike.
                pipe = self._client.pipeline(transaction=False)
                pipe.get(self._keys.user(user_id))
                pipe.get(self._keys.seen(user_id))
                if self._recent_bytes:
                    pipe.getrange(self._keys.positives(user_id), -self._recent_bytes, -1)
                if self.catalog_seq_key is not None:
                    pipe.get(self.catalog_seq_key)
                answers = await pipe.execute()
        recent = answers[2] if self._recent_bytes else None
        seq = int(answers[-1] or 0) if self.catalog_seq_key is not None else 0
        return decode_user(answers[0], answers[1], self._schema.user_blob_width, recent, seq)

    async def items(self, keys: Sequence[bytes], timeout_s: float) -> ItemBlobs:
        """Blobs for the given item keys: MGETs in chunks, sent as one pipeline.

        On a Redis Cluster the keys live in many slots; the client splits them by slot and
        pipelines the MGETs to each node.
        """
        _require_time(timeout_s)
        with self._breaker.guard(FeatureStoreError):
            async with redis_call("read items", timeout_s):
                values = await self._mget(keys)
        return decode_item_blobs(values, self._schema.item_blob_width)

    async def _mget(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if isinstance(self._client, RedisCluster):
            found: list[bytes | None] = await self._client.mget_nonatomic(keys)
            return found
        pipe = self._client.pipeline(transaction=False)
        for start in range(0, len(keys), MGET_CHUNK):
            pipe.mget(keys[start : start + MGET_CHUNK])
        chunks = await pipe.execute()
        return [value for chunk in chunks for value in chunk]

    async def check_layout(self, timeout_s: float) -> str:
        """Refuse data written with another layout than the schema's; return its world id."""
        async with redis_call("read layout", timeout_s):
            stored = await self._client.hgetall(self._keys.meta)
        stored_text = {as_text(key): as_text(value) for key, value in stored.items()}
        if not stored_text:
            raise SchemaError(
                f"Redis has no {self._keys.meta}: load the features first (recsys load-redis)"
            )
        expected = layout_meta(self._schema)
        differing = {
            k: (stored_text.get(k), v) for k, v in expected.items() if stored_text.get(k) != v
        }
        if differing:
            raise SchemaError(
                f"Redis data was written with another layout: {differing} (stored, expected); "
                "load the world again (recsys load-redis --world DIR)"
            )
        return stored_text.get(WORLD_ID_FIELD, "")

    async def items_version(self, timeout_s: float) -> str | None:
        """The version of the last complete load of the item blobs; None during a load."""
        async with redis_call("read items version", timeout_s):
            value = await self._client.hget(self._keys.meta, ITEMS_VERSION_FIELD)
        return None if value is None else as_text(value)

    async def world_id(self, timeout_s: float) -> str | None:
        """The id of the world Redis holds ("" for an unstamped load); None when unreadable."""
        try:
            async with asyncio.timeout(timeout_s):
                value = await self._client.hget(self._keys.meta, WORLD_ID_FIELD)
        except (redis_errors.RedisError, OSError, TimeoutError):
            return None
        return "" if value is None else as_text(value)

    async def world_state(self, timeout_s: float) -> tuple[bool, str | None]:
        """Whether Redis answered, and the layout record's world id ("" for an unstamped
        load, None for no layout record at all). The record is a few short fields: one
        HGETALL, which the API's Redis user may run (deploy/quadlet/redis-users.acl)."""
        try:
            async with asyncio.timeout(timeout_s):
                stored = await self._client.hgetall(self._keys.meta)
        except (redis_errors.RedisError, OSError, TimeoutError):
            return False, None
        if not stored:
            return True, None
        fields = {as_text(key): value for key, value in stored.items()}
        world = fields.get(WORLD_ID_FIELD)
        return True, "" if world is None else as_text(world)

    async def aclose(self) -> None:
        await self._client.aclose()


def redis_of(settings: Settings, max_connections: int, timeout_s: float) -> RedisClient:
    """The client the settings name (URL, cluster or not, ACL user and password)."""
    password = settings.redis_password
    return connect_redis(
        settings.redis_url,
        max_connections,
        timeout_s,
        cluster=settings.redis_cluster,
        username=settings.redis_username,
        password=password.get_secret_value() if password is not None else None,
    )


def connect_redis(
    url: str,
    max_connections: int,
    timeout_s: float,
    cluster: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> RedisClient:
    """A pooled client; creating it does no I/O, the first command connects.

    With `cluster`, `url` names any node of a Redis Cluster; the client learns the others.
    `username` and `password` (an ACL user) take precedence over any in the URL.
    """
    login = {
        key: value
        for key, value in (("username", username), ("password", password))
        if value is not None
    }
    if cluster:
        # Every call is bounded by its own deadline (`_call`), so the client's socket
        # timeout is only a backstop: a socket timeout makes the cluster client mark the
        # node's connections for reconnection and map the whole cluster again, so at the
        # call's own timeout one slow node would reset the connections to every node and
        # fail reads of healthy ones meanwhile.
        return RedisCluster.from_url(
            url,
            max_connections=max_connections,
            socket_timeout=CLUSTER_SOCKET_TIMEOUT_S,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            **login,
        )
    # A blocking pool makes a burst wait for a connection instead of failing outright; each
    # call's own deadline bounds that wait. No retries: a retry cannot fit a budget of tens
    # of milliseconds, and the breaker, not a retry loop, handles a Redis that is down.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        **login,
    )
    return aioredis.Redis.from_pool(pool)
