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

from collections.abc import AsyncIterator, Sequence
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

# A page of the log at most about this many bytes, and this many entries: a fold's part
# holds a thousand items (megabytes), a batch as accepted often one.
PAGE_BYTES = 4 * 2**20
PAGE_ENTRIES = 500
# The fold's parts written beside the log this many at a time.
FOLD_WRITES = 8

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


# KEYS: the log, its fold (written beforehand), a scratch stream. ARGV: the id of the last
# entry folded. The fold, then every entry appended since, numbered after the log's last id
# (so a process that read up to any entry reads what follows it next), take the log's place.
_REPLACE = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 0
end
local head = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1][1]
local ms, n = string.match(head, '^(%d+)-(%d+)$')
n = tonumber(n)
redis.call('DEL', KEYS[3])
local function copy(entries)
  for _, entry in ipairs(entries) do
    n = n + 1
    redis.call('XADD', KEYS[3], ms .. '-' .. n, unpack(entry[2]))
  end
end
copy(redis.call('XRANGE', KEYS[2], '-', '+'))
copy(redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+'))
redis.call('RENAME', KEYS[3], KEYS[1])
redis.call('DEL', KEYS[2])
return 1
"""
# KEYS: the hold. ARGV: its holder. Let go only by the holder (it may have expired and been
# taken since).
_LET_GO = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class LogPage:
    """Entries of the log, and the number of its last batch as Redis read it with them."""

    entries: list[Logged]
    head: int


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
        self._folded = keys.catalog(world_id, "folded")
        self._scratch = keys.catalog(world_id, "scratch")
        self._item = keys.item
        self._accept = client.register_script(_ACCEPT)
        self._replace = client.register_script(_REPLACE)
        self._let_go = client.register_script(_LET_GO)

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
        room could not be applied there). While the log is empty it may still change: a
        deployment gone before any change left nothing that depends on it."""
        async with redis_call("catalog room", timeout_s):
            pipe = self._client.pipeline(transaction=False)
            pipe.set(self._room, capacity, nx=True)
            pipe.get(self._room)
            pipe.exists(self._log)
            _, held, logged = await pipe.execute()
            if held is not None and int(held) != capacity and not logged:
                await self._client.set(self._room, capacity)
                held = capacity
        if held is not None and int(held) != capacity:
            raise ConfigError(
                f"RECSYS_CATALOG_HEADROOM is {capacity} here, {int(held)} in the processes "
                f"that began this world's catalog change log: set the same everywhere (the "
                f"world's room is kept in Redis as {self._room})"
            )

    async def read(self, after: str, count: int, timeout_s: float) -> LogPage:
        """Up to `count` entries after stream id `after` ("-" for all), oldest first."""
        start = "-" if after == "-" else f"({after}"
        async with redis_call("catalog read", timeout_s):
            pipe = self._client.pipeline(transaction=False)
            pipe.xrange(self._log, start, "+", count=count)
            pipe.get(self._seq)
            entries, head = await pipe.execute()
        logged = [
            Logged(as_text(entry_id), fields)
            for entry_id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries)
        ]
        return LogPage(logged, int(head or 0))

    async def pages(self, timeout_s: float) -> AsyncIterator[list[Logged]]:
        """The whole log, a page of about PAGE_BYTES at a time (by its largest entry yet)."""
        after, count, largest = "-", 1, 1
        while True:
            page = (await self.read(after, count, timeout_s)).entries
            if page:
                yield page
                after = page[-1].entry_id
                largest = max(largest, *(entry.size for entry in page))
            if len(page) < count:
                return
            count = page_entries(largest)

    async def length(self, timeout_s: float) -> tuple[int, int]:
        """The entries the log holds, and how many of them are the parts of a fold."""
        async with redis_call("catalog length", timeout_s):
            pipe = self._client.pipeline(transaction=False)
            pipe.xlen(self._log)
            pipe.xrange(self._log, "-", "+", count=1)
            length, first = await pipe.execute()
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], first)
        part = Logged(as_text(entries[0][0]), entries[0][1]).part if entries else None
        return int(length), (part[1] if part is not None and part[0] == 0 else 0)

    async def hold_compaction(self, holder: str, hold_s: float, timeout_s: float) -> bool:
        """Whether `holder` may compact the log now (one at a time, for `hold_s` at most)."""
        async with redis_call("catalog compaction", timeout_s):
            held = await self._client.set(self._compacting, holder, nx=True, px=int(hold_s * 1000))
        return bool(held)

    async def let_go(self, holder: str, timeout_s: float) -> None:
        async with redis_call("catalog compaction", timeout_s):
            await self._let_go(keys=[self._compacting], args=[holder])

    async def replace(self, last_id: str, parts: Sequence[ChangeBatch], timeout_s: float) -> bool:
        """The log replaced by `parts` (its fold up to `last_id`, app.release.compaction)
        and every entry appended after `last_id`; False when the log was replaced by another
        since it was read (nothing changed). The parts are written beside it first, a few
        at a time, then put in its place by one script."""
        async with redis_call("catalog fold", timeout_s):
            await self._client.delete(self._folded)
            for start in range(0, len(parts), FOLD_WRITES):
                pipe = self._client.pipeline(transaction=False)
                for number, batch in enumerate(parts[start : start + FOLD_WRITES], start):
                    pipe.xadd(self._folded, _fields(batch, f"{number}/{len(parts)}"))
                await pipe.execute()
        async with redis_call("catalog replace", timeout_s):
            keys = [self._log, self._folded, self._scratch]
            replaced = await self._replace(keys=keys, args=[last_id])
        return bool(replaced)


def page_entries(largest: int) -> int:
    """Entries a page may hold, when the largest seen is `largest` bytes."""
    return max(1, min(PAGE_ENTRIES, PAGE_BYTES // max(largest, 1)))


def _fields(batch: ChangeBatch, part: str) -> dict[Any, Any]:
    changed: list[ItemChange | Withdrawal] = [*batch.puts, *batch.withdrawals]
    positions = ",".join(str(change.position) for change in changed)
    body = encode_changes(batch.puts, batch.withdrawals)
    return {"seq": batch.seq, "body": body, "positions": positions, "part": part}


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
