"""Redis as the feature store: one packed FP32 blob per user and per item.

Keys: `{prefix}:u:{user_id}` and `{prefix}:i:{item_id}` hold blobs in the schema's layouts,
`{prefix}:seen:{user_id}` a list of recently seen item ids (newest first), and `{prefix}:meta`
the layout the data was written with, checked once at start-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from app.errors import FailureKind, FeatureStoreError, SchemaError
from app.schema import FeatureSchema

FLOAT32 = np.dtype("<f4")
MGET_CHUNK = 500


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str

    def user(self, user_id: str) -> str:
        return f"{self.prefix}:u:{user_id}"

    def item(self, item_id: str) -> str:
        return f"{self.prefix}:i:{item_id}"

    def seen(self, user_id: str) -> str:
        return f"{self.prefix}:seen:{user_id}"

    @property
    def meta(self) -> str:
        return f"{self.prefix}:meta"

    def item_keys(self, item_ids: npt.NDArray[np.str_]) -> npt.NDArray[np.bytes_]:
        """Every item's key, encoded once, so a request only indexes into this array."""
        keys: npt.NDArray[np.bytes_] = np.char.encode(np.char.add(self.item(""), item_ids), "utf-8")
        return keys


def layout_meta(schema: FeatureSchema) -> dict[str, str]:
    """What the writer records about the blobs, so a reader can refuse a different layout."""
    return {
        "schema_version": str(schema.version),
        "embedding_dim": str(schema.embedding_dim),
        "user_dense": ",".join(schema.user_dense),
        "item_dense": ",".join(schema.item_dense),
    }


@dataclass(frozen=True, slots=True)
class UserRecord:
    blob: npt.NDArray[np.float32] | None
    seen: list[str]


@dataclass(frozen=True, slots=True)
class ItemBlobs:
    """Blobs of the items that had valid ones; `found` indexes into the requested keys."""

    found: npt.NDArray[np.intp]
    matrix: npt.NDArray[np.float32]
    malformed: int


def decode_item_blobs(values: Sequence[bytes | None], width: int) -> ItemBlobs:
    """Stack the blobs of length `width` floats into one matrix with a single frombuffer."""
    nbytes = width * FLOAT32.itemsize
    valid = [i for i, value in enumerate(values) if value is not None and len(value) == nbytes]
    present = sum(value is not None for value in values)
    raw = b"".join(values[i] or b"" for i in valid)
    matrix = np.frombuffer(raw, dtype=FLOAT32).reshape(len(valid), width)
    return ItemBlobs(np.asarray(valid, dtype=np.intp), matrix, present - len(valid))


def decode_blob(value: bytes | None, width: int) -> npt.NDArray[np.float32] | None:
    if value is None or len(value) != width * FLOAT32.itemsize:
        return None
    return np.frombuffer(value, dtype=FLOAT32)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, redis_errors.TimeoutError | TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, redis_errors.ConnectionError | OSError):
        return FailureKind.UNAVAILABLE
    return FailureKind.ERROR


@asynccontextmanager
async def _mapped_errors(operation: str) -> AsyncIterator[None]:
    try:
        yield
    except (redis_errors.RedisError, OSError, TimeoutError) as exc:
        raise FeatureStoreError(_failure_kind(exc), f"{operation}: {exc}") from exc


class FeatureStore:
    """Reads user and item features; owns nothing but the Redis client it is given."""

    def __init__(
        self, client: aioredis.Redis, schema: FeatureSchema, keys: KeySpace, max_seen: int
    ) -> None:
        self._client = client
        self._schema = schema
        self._keys = keys
        self._max_seen = max_seen

    @property
    def keys(self) -> KeySpace:
        return self._keys

    async def user(self, user_id: str) -> UserRecord:
        """The user's blob and recently seen items, in one round trip."""
        async with _mapped_errors("read user"):
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self._keys.user(user_id))
            pipe.lrange(self._keys.seen(user_id), 0, self._max_seen - 1)
            blob, seen = await pipe.execute()
        return UserRecord(
            blob=decode_blob(blob, self._schema.user_blob_width),
            seen=[item.decode() for item in seen],
        )

    async def items(self, keys: Sequence[bytes]) -> ItemBlobs:
        """Blobs for the given item keys: MGETs in chunks, sent as one pipeline."""
        async with _mapped_errors("read items"):
            pipe = self._client.pipeline(transaction=False)
            for start in range(0, len(keys), MGET_CHUNK):
                pipe.mget(keys[start : start + MGET_CHUNK])
            chunks = await pipe.execute()
        values = [value for chunk in chunks for value in chunk]
        return decode_item_blobs(values, self._schema.item_blob_width)

    async def check_layout(self) -> None:
        """Refuse data written with another layout than the schema's."""
        async with _mapped_errors("read layout"):
            stored = await self._client.hgetall(self._keys.meta)
        stored_text = {_text(key): _text(value) for key, value in stored.items()}
        if not stored_text:
            raise SchemaError(
                f"Redis has no {self._keys.meta}: load the features first (recsys load-redis)"
            )
        expected = layout_meta(self._schema)
        differing = {
            k: (stored_text.get(k), v) for k, v in expected.items() if stored_text.get(k) != v
        }
        if differing:
            raise SchemaError(f"Redis blobs were written with another layout: {differing}")

    async def aclose(self) -> None:
        await self._client.aclose()

    async def ping(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self._client.ping())
        except (redis_errors.RedisError, OSError, TimeoutError):
            return False


def connect_redis(url: str, max_connections: int, timeout_s: float) -> aioredis.Redis:
    """A pooled client; creating it does no I/O, the first command connects."""
    # A blocking pool makes a burst wait for a connection instead of failing outright.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )
    return aioredis.Redis.from_pool(pool)
