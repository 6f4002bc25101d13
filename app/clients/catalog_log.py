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
from app.core.errors import CatalogChangeRefusedError
from app.release.arrivals import (
    CatalogRoom,
    ChangeBatch,
    ItemChange,
    Withdrawal,
    decode_changes,
    encode_changes,
)
from app.release.keyspace import KeySpace

READ_BATCHES = 500

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
        self._item = keys.item
        self._accept = client.register_script(_ACCEPT)

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
        blobs: bool = True,
    ) -> Accepted:
        """Accept the batch; each change's `position` is used where >= 0 (a world item).

        The items' feature blobs are written first, for processes that read item features
        from Redis: a blob of a batch then refused names an item no catalog holds, and is
        never read. `blobs=False` leaves them (the consumer's refits: it may not write item
        keys, which the world's items share)."""
        async with redis_call("catalog append", timeout_s):
            if puts and blobs:
                pipe = self._client.pipeline(transaction=False)
                for put in puts:
                    pipe.set(self._item(put.item_id), put.blob().tobytes())
                await pipe.execute()
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

    async def read(self, after: str, timeout_s: float) -> list[tuple[str, ChangeBatch]]:
        """Batches after stream id `after` ("-" for all), oldest first, READ_BATCHES at most."""
        start = "-" if after == "-" else f"({after}"
        async with redis_call("catalog read", timeout_s):
            entries = await self._client.xrange(self._log, start, "+", count=READ_BATCHES)
        batches: list[tuple[str, ChangeBatch]] = []
        for entry_id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], entries):
            seq = int(fields[b"seq"])
            positions = _positions(as_text(fields[b"positions"]))
            batches.append(
                (as_text(entry_id), decode_changes(seq, as_text(fields[b"body"]), positions))
            )
        return batches


class LogReader:
    """Where one process stands in the log, and what brings its room to the log's end."""

    def __init__(self, changes: CatalogLog, room: CatalogRoom) -> None:
        self._changes = changes
        self.room = room
        self._after = "-"

    @property
    def changes(self) -> CatalogLog:
        return self._changes

    async def catch_up(self, timeout_s: float) -> list[ChangeBatch]:
        """Apply every batch past the last one applied; returns those applied."""
        applied: list[ChangeBatch] = []
        while True:
            page = await self._changes.read(self._after, timeout_s)
            for entry_id, batch in page:
                if batch.seq > self.room.seq:
                    self.room.apply(batch)
                    applied.append(batch)
                self._after = entry_id
            if len(page) < READ_BATCHES:
                return applied
