"""The event log as its consumer reads it: a consumer group's reads, claims and acks on the
partitions' streams, their dead letters, and what the consumer reads beside them (the
world Redis holds, trending, the answers' notes, Redis's memory).

The API's side, appending, is app.clients.event_log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

from app.clients.exposure import exposure_keys
from app.clients.feature_store import WORLD_ID_FIELD, RedisClient
from app.core.ingest_metrics import DeadLetter
from app.release.keyspace import KeySpace

# Raises decayed trending scores, kept in log2 space, score = log2(sum of 2^(ts / half-life)),
# so they stay small and compare as the decayed counts they stand for, at any moment; only
# the 10,000 highest are kept.
TRENDING_SCRIPT = """
for n = 1, #ARGV, 2 do
  local x = tonumber(ARGV[n + 1])
  local old = redis.call('ZSCORE', KEYS[1], ARGV[n])
  local new = x
  if old then
    old = tonumber(old)
    local high, low = math.max(old, x), math.min(old, x)
    new = high + math.log(1 + 2 ^ (low - high)) / math.log(2)
  end
  redis.call('ZADD', KEYS[1], new, ARGV[n])
end
local excess = redis.call('ZCARD', KEYS[1]) - 10000
if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1) end
return 0
"""

BLOCK_MS = 1000
DEAD_LETTERS_KEPT = 100_000


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: bytes
    fields: dict[bytes, bytes]

    @property
    def ms(self) -> int:
        return int(self.entry_id.split(b"-", 1)[0])


@dataclass(frozen=True, slots=True)
class SetAside:
    """What goes to the dead letters: the entry it came from, what is kept of it, and why."""

    entry_id: bytes
    payload: dict[bytes, bytes]
    reason: DeadLetter
    why: str


def transient(exc: BaseException) -> bool:
    """Redis unreachable, loading, read-only, or out of memory: wait, retry as it was."""
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError | OSError):
        return True
    if isinstance(exc, TimeoutError | redis_errors.ReadOnlyError | redis_errors.ClusterError):
        return True
    text = str(exc)
    return isinstance(exc, redis_errors.ResponseError) and any(
        word in text for word in ("OOM", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN")
    )


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class EventStream:
    """One consumer's view of the partitions' streams, under its stable name."""

    def __init__(self, client: RedisClient, keys: KeySpace, name: str, batch: int) -> None:
        self._client = client
        self._keys = keys
        self._group = keys.ingest_group
        self._name = name
        self._batch = batch
        self._trending = client.register_script(TRENDING_SCRIPT)

    async def ensure_groups(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            try:
                await self._client.xgroup_create(
                    self._keys.events(partition), self._group, id="0", mkstream=True
                )
            except redis_errors.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read(self, partition: int, cursor: str) -> tuple[list[Entry], list[bytes]]:
        """The entries read ("0": this consumer's pending ones; ">": new ones, waiting up to
        a second), and the ids of pending ones whose entry was trimmed away."""
        block = None if cursor == "0" else BLOCK_MS
        stream = self._keys.events(partition)
        answer: Any = await self._client.xreadgroup(
            self._group, self._name, {stream: cursor}, count=self._batch, block=block
        )
        if not answer:
            return [], []
        _, messages = answer[0]
        entries = [Entry(entry_id, dict(fields)) for entry_id, fields in messages if fields]
        return entries, [entry_id for entry_id, fields in messages if not fields]

    async def claim(self, partition: int, idle_ms: int, start: str) -> tuple[list[Entry], str]:
        """What another consumer read and left idle this long, taken over, and where the
        next claim starts; trimmed ones XAUTOCLAIM drops from the pending list itself."""
        answer: Any = await self._client.xautoclaim(
            self._keys.events(partition),
            self._group,
            self._name,
            min_idle_time=idle_ms,
            start_id=start,
            count=self._batch,
        )
        following = _text(answer[0]) if answer else "0-0"
        messages = answer[1] if answer and len(answer) > 1 else []
        return [Entry(entry_id, dict(fields)) for entry_id, fields in messages if fields], following

    async def ack(self, partition: int, entry_ids: Sequence[bytes]) -> None:
        if entry_ids:
            await self._client.xack(self._keys.events(partition), self._group, *entry_ids)

    async def pending(self, partition: int) -> int:
        summary: Any = await self._client.xpending(self._keys.events(partition), self._group)
        return int(summary.get("pending", 0) if summary else 0)

    async def set_aside(self, partition: int, dead: Sequence[SetAside]) -> None:
        pipe: Any = self._client.pipeline(transaction=False)
        for aside in dead:
            fields = {**aside.payload, b"dead.reason": aside.reason.value, b"dead.why": aside.why}
            fields[b"dead.entry"] = aside.entry_id
            key = self._keys.dead_letters(partition)
            pipe.xadd(key, fields, maxlen=DEAD_LETTERS_KEPT, approximate=True)
        await pipe.execute()

    async def world_id(self) -> str:
        """The world id the layout record holds ("" for none, or a load before stamping)."""
        raw: Any = await self._client.hget(self._keys.meta, WORLD_ID_FIELD)
        return "" if raw is None else _text(raw)

    async def raise_trending(self, raised: Sequence[tuple[int, float]]) -> None:
        """Each (item position, its positive's time in half-lives) raises the item's count."""
        if raised:
            args = [value for pair in raised for value in pair]
            await self._trending(keys=[self._keys.trending], args=args)

    async def count_chosen(self, world_id: str, positions: Sequence[int]) -> None:
        """One more positive for each of `positions`, items added while serving: what
        exploration's bandit learns from (app.clients.exposure)."""
        if not positions:
            return
        _, chosen = exposure_keys(self._keys, world_id)
        pipe: Any = self._client.pipeline(transaction=False)
        for position in positions:
            pipe.hincrby(chosen, str(position), 1)
        await pipe.execute()

    async def answers(self, answer_ids: Sequence[str]) -> list[bytes | None]:
        """The variant noted for each answer id (None: no such answer, or too old)."""
        if not answer_ids:
            return []
        pipe: Any = self._client.pipeline(transaction=False)
        for answer_id in answer_ids:
            pipe.get(self._keys.answer(answer_id))
        return list(await pipe.execute())

    async def memory(self) -> tuple[int, int]:
        """Redis's used memory and its maxmemory (0: no limit), over every node."""
        info: Any = await self._client.info("memory")
        nodes = [info] if "used_memory" in info else list(info.values())
        used = sum(int(node.get("used_memory", 0)) for node in nodes)
        most = sum(int(node.get("maxmemory", 0)) for node in nodes)
        return used, most
