"""The catalog's change log in Redis: items put into the catalog or withdrawn while serving.

A stream per world, with a counter of its batches and a hash of the positions it gave added
items (app.release.keyspace `catalog`). One script accepts a batch whole or not at all: it
gives each new id the next position, refuses a batch past the room every process holds,
numbers it and appends it. Every API process and the ingest consumer read the stream from
its start (a process started later replays it) and apply it in order; a request reads the
counter with the user's features, so it never answers from a catalog older than a change
acknowledged before it began.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from app.clients.feature_store import RedisClient, as_text, redis_call
from app.core.errors import CatalogChangeRefusedError, ConfigError, UnappliableBatchError
from app.release.arrivals import (
    ChangeBatch,
    ItemChange,
    Withdrawal,
    decode_changes,
    encode_changes,
)
from app.release.keyspace import KeySpace

# KEYS: positions hash, seq, log, the seq of the last batch that withdrew. ARGV: base,
# capacity, body, the number of puts, then (id, known position) for each put and each
# withdrawal in order; a known position is -1 where the caller does not know the item (not
# a world item).
_ACCEPT = """
local base = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local puts = tonumber(ARGV[4])
local n = (#ARGV - 4) / 2
local used = redis.call('HLEN', KEYS[1])
local positions = {}
local fresh = {}
local added = 0
for i = 1, n do
  local id = ARGV[3 + 2 * i]
  local known = tonumber(ARGV[4 + 2 * i])
  if known >= 0 then
    positions[i] = known
  else
    local stored = redis.call('HGET', KEYS[1], id)
    if stored then
      positions[i] = tonumber(stored)
    elseif fresh[id] then
      positions[i] = fresh[id]
    elseif i <= puts then
      if used + added >= capacity then
        return {'full', tostring(used)}
      end
      fresh[id] = base + used + added
      added = added + 1
      positions[i] = fresh[id]
    else
      return {'unknown', id}
    end
  end
end
for id, position in pairs(fresh) do
  redis.call('HSET', KEYS[1], id, position)
end
local seq = redis.call('INCR', KEYS[2])
if n > puts then
  redis.call('SET', KEYS[4], seq)
end
local joined = table.concat(positions, ',')
redis.call('XADD', KEYS[3], '*', 'seq', seq, 'body', ARGV[3], 'positions', joined)
return {'ok', tostring(seq), joined}
"""


# KEYS: the log, a scratch stream. ARGV: the id of the last entry folded, the number of
# parts, then (seq, body, positions, part) for each. Ids follow the last one folded's.
_REPLACE = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 or last[1][1] ~= ARGV[1] then
  return 0
end
local ms, n = string.match(ARGV[1], '^(%d+)-(%d+)$')
redis.call('DEL', KEYS[2])
for i = 1, tonumber(ARGV[2]) do
  local at = 3 + 4 * (i - 1)
  redis.call('XADD', KEYS[2], ms .. '-' .. (tonumber(n) + i), 'seq', ARGV[at],
    'body', ARGV[at + 1], 'positions', ARGV[at + 2], 'part', ARGV[at + 3])
end
redis.call('RENAME', KEYS[2], KEYS[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class Accepted:
    seq: int
    positions: tuple[int, ...]  # the puts', then the withdrawals'


def _positions(joined: str) -> list[int]:
    return [int(p) for p in joined.split(",")] if joined else []


class CatalogLog:
    """One world's change log; FeatureStoreError when Redis cannot answer."""

    def __init__(self, client: RedisClient, keys: KeySpace, world_id: str) -> None:
        self._client = client
        self._positions = keys.catalog(world_id, "positions")
        self._seq = keys.catalog(world_id, "seq")
        self._withdrawn_seq = keys.catalog(world_id, "withdrawn_seq")
        self._log = keys.catalog(world_id, "log")
        self._room = keys.catalog(world_id, "room")
        self._compacting = keys.catalog(world_id, "compacting")
        self._folding = keys.catalog(world_id, "folding")
        self._item = keys.item
        self._accept = client.register_script(_ACCEPT)
        self._replace = client.register_script(_REPLACE)

    @property
    def seq_key(self) -> str:
        return self._seq

    @property
    def withdrawn_seq_key(self) -> str:
        """The number of the last batch that withdrew an item: what a request must have
        applied before it answers (an addition may reach it a moment later)."""
        return self._withdrawn_seq

    async def append(
        self,
        puts: Sequence[ItemChange],
        withdrawals: Sequence[Withdrawal],
        base: int,
        capacity: int,
        timeout_s: float,
    ) -> Accepted:
        """Accept the batch whole or refuse it (CatalogChangeRefusedError: no room, or an
        unknown item), nothing written; each change's `position` is used where >= 0 (a world
        item). FeatureStoreError: Redis did not answer, and the batch may or may not be in
        the log."""
        async with redis_call("catalog append", timeout_s):
            args: list[Any] = [base, capacity, encode_changes(puts, withdrawals), len(puts)]
            changed: list[ItemChange | Withdrawal] = [*puts, *withdrawals]
            for change in changed:
                args += [change.item_id, change.position]
            keys = [self._positions, self._seq, self._log, self._withdrawn_seq]
            answer = await self._accept(keys=keys, args=args)
        outcome, *rest = [as_text(part) for part in cast(list[Any], answer)]
        if outcome == "full":
            raise CatalogChangeRefusedError(
                "items", f"the catalog has no room past {rest[0]} added items"
            )
        if outcome == "unknown":
            raise CatalogChangeRefusedError("item_ids", f"no item {rest[0]!r} in the catalog")
        return Accepted(int(rest[0]), tuple(_positions(rest[1])))

    async def write_features(self, puts: Sequence[ItemChange], timeout_s: float) -> None:
        """The items' feature blobs, for processes that read item features from Redis:
        written once the log accepted their batch, so a refused batch changes no blob. Until
        then such a process reads the item's blob as it was (a new item's as missing). The
        consumer's refits write none: it may not write item keys, which the world's items
        share."""
        async with redis_call("catalog item features", timeout_s):
            pipe = self._client.pipeline(transaction=False)
            for put in puts:
                pipe.set(self._item(put.item_id), put.blob().tobytes())
            await pipe.execute()

    async def agree_on_room(self, capacity: int, timeout_s: float) -> None:
        """ConfigError unless every process of this world holds room for `capacity` added
        items: the first to start sets it, the others must agree (positions past a smaller
        room could not be applied there)."""
        async with redis_call("catalog room", timeout_s):
            await self._client.set(self._room, capacity, nx=True)
            held = await self._client.get(self._room)
        if held is not None and int(held) != capacity:
            raise ConfigError(
                f"RECSYS_CATALOG_HEADROOM is {capacity} here, {int(held)} in the processes "
                "that began this world's catalog change log: set the same everywhere"
            )

    async def read(self, after: str, count: int, timeout_s: float) -> list[Logged]:
        """Up to `count` entries after stream id `after` ("-" for all), oldest first."""
        start = "-" if after == "-" else f"({after}"
        async with redis_call("catalog read", timeout_s):
            entries = await self._client.xrange(self._log, start, "+", count=count)
        return [
            Logged(as_text(entry_id), fields)
            for entry_id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries)
        ]

    async def length(self, timeout_s: float) -> int:
        """The entries the log holds."""
        async with redis_call("catalog length", timeout_s):
            return int(await self._client.xlen(self._log))

    async def hold_compaction(self, hold_s: float, timeout_s: float) -> bool:
        """Whether this process may compact the log now (one at a time, for `hold_s`)."""
        async with redis_call("catalog compaction", timeout_s):
            held = await self._client.set(self._compacting, "1", nx=True, px=int(hold_s * 1000))
        return bool(held)

    async def replace(self, last_id: str, parts: Sequence[ChangeBatch], timeout_s: float) -> bool:
        """The log replaced by `parts` (a fold of it, app.release.compaction), unless an entry
        was appended after `last_id`, the last one folded: then False, nothing changed.

        The parts are numbered after `last_id`, so a process that read up to any entry of
        the old log reads every part next, and tells them from batches by their `part`."""
        args: list[Any] = [last_id, len(parts)]
        for number, batch in enumerate(parts):
            changed: list[ItemChange | Withdrawal] = [*batch.puts, *batch.withdrawals]
            positions = [change.position for change in changed]
            body = encode_changes(batch.puts, batch.withdrawals)
            args += [batch.seq, body, ",".join(map(str, positions)), f"{number}/{len(parts)}"]
        async with redis_call("catalog replace", timeout_s):
            replaced = await self._replace(keys=[self._log, self._folding], args=args)
        return bool(replaced)


@dataclass(frozen=True, slots=True)
class Logged:
    """One entry of the log as Redis holds it."""

    entry_id: str
    fields: dict[bytes, bytes]

    @property
    def seq(self) -> int:
        """The batch's number; 0 where the entry has none this code can read."""
        try:
            return int(self.fields[b"seq"])
        except (KeyError, ValueError):
            return 0

    @property
    def part(self) -> tuple[int, int] | None:
        """(its number, of how many) for a part of a fold; None for a batch as accepted."""
        raw = self.fields.get(b"part")
        if raw is None:
            return None
        number, _, total = raw.decode(errors="replace").partition("/")
        try:
            return int(number), int(total)
        except ValueError:
            return None

    @property
    def size(self) -> int:
        return sum(len(value) for value in self.fields.values())

    def batch(self) -> ChangeBatch:
        """The batch; UnappliableBatchError when the entry is not one this code wrote."""
        try:
            body = self.fields[b"body"].decode()
            positions = _positions(self.fields[b"positions"].decode())
        except (KeyError, UnicodeDecodeError, ValueError) as exc:
            raise UnappliableBatchError(f"entry {self.entry_id} is no batch: {exc!r}") from None
        return decode_changes(self.seq, body, positions)
