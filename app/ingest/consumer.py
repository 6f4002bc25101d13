"""The ingest consumer: reads the event log and applies it to what /recommend reads.

One task per partition this consumer owns (`p % n == i`), each reading its stream with the
consumer group, so a user's events apply in order and several consumers share the work.
A batch is applied in three steps, in this order:
1. every user's change (seen list, positives, impression counts, vector, the ids of the
   events applied) in one script, atomic like a transaction: on one Redis one for the
   batch, on a Redis Cluster one per user (a user's keys share a hash tag);
2. the events that could not be applied appended to the dead-letter stream, with why;
3. the batch acknowledged.
A consumer killed anywhere in between reads its unacknowledged events again when it comes
back (its pending list, by its stable name), and the ids it finds already applied change
nothing. Trending counts and variant credits come after the transaction: a crash just
then loses them for one batch (at most once), never doubles them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from app.clients.feature_store import FLOAT32, RedisClient, decode_seen, encode_seen
from app.core.events import (
    Event,
    EventType,
    IngestOutcome,
    MalformedEventError,
    decode_entry,
)
from app.core.metrics import DeadLetter, IngestMetrics
from app.core.vocabulary import Variant
from app.ingest.apply import UserChange, UserState, change_for
from app.ingest.scripts import READ_SCRIPT, TRENDING_SCRIPT, WRITE_SCRIPT
from app.ingest.world import IngestWorld
from app.release.keyspace import KeySpace

log = logging.getLogger("recsys.ingest")
T = TypeVar("T")
GROUP = "ingest"
BLOCK_MS = 1000
# Event ids kept per user for spotting a retried event: past this many they start afresh.
APPLIED_IDS_KEPT = 1024


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


@dataclass(slots=True)
class Sorted:
    """A batch's entries: the events of each user in order, and those set aside."""

    by_user: dict[str, list[tuple[Event, int]]]
    dead: list[SetAside]
    entry_of: dict[int, bytes]  # by id() of each decoded event: to set a user's aside


class Consumer:
    def __init__(
        self,
        client: RedisClient,
        world: IngestWorld,
        keys: KeySpace,
        metrics: IngestMetrics,
        *,
        partitions: Sequence[int],
        name: str,
        batch: int,
        impressions_to_seen: int,
        half_life_s: float,
        dedupe_s: int,
        claim_idle_s: float,
    ) -> None:
        self._client = client
        self._world = world
        self._keys = keys
        self._metrics = metrics
        self._partitions = list(partitions)
        self._name = name
        self._batch = batch
        self._impressions_to_seen = impressions_to_seen
        self._half_life_s = half_life_s
        self._dedupe_s = dedupe_s
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._cluster = isinstance(client, RedisCluster)
        self._lag_s: dict[int, float] = {p: 0.0 for p in self._partitions}
        self._trending = client.register_script(TRENDING_SCRIPT)
        self._read_script = client.register_script(READ_SCRIPT)
        self._write_script = client.register_script(WRITE_SCRIPT)

    async def ensure_groups(self) -> None:
        for partition in self._partitions:
            try:
                await self._client.xgroup_create(
                    self._keys.events(partition), GROUP, id="0", mkstream=True
                )
            except redis_errors.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def run(self, stop: asyncio.Event) -> None:
        """Consume every owned partition until `stop` is set (a batch in hand is finished)."""
        await self.ensure_groups()
        tasks = [asyncio.create_task(self._partition(p, stop)) for p in self._partitions]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _partition(self, partition: int, stop: asyncio.Event) -> None:
        stream = self._keys.events(partition)
        # First what this consumer read before and never acknowledged (it died mid-batch).
        cursor = "0"
        next_claim = time.monotonic() + self._claim_idle_ms / 1000.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_claim:
                    await self._claim(partition)
                    next_claim = time.monotonic() + self._claim_idle_ms / 1000.0
                entries = await self._read(stream, cursor)
                if cursor == "0" and not entries:
                    cursor = ">"
                    continue
                await self.apply(partition, entries)
            except (redis_errors.RedisError, OSError) as exc:
                log.warning(
                    "partition %d: %s: %s; retrying in 1 s", partition, type(exc).__name__, exc
                )
                await asyncio.sleep(1.0)

    async def _read(self, stream: str, cursor: str) -> list[Entry]:
        block = None if cursor == "0" else BLOCK_MS
        answer: Any = await self._client.xreadgroup(
            GROUP, self._name, {stream: cursor}, count=self._batch, block=block
        )
        if not answer:
            return []
        _, messages = answer[0]
        return [Entry(entry_id, dict(fields)) for entry_id, fields in messages if fields]

    async def _claim(self, partition: int) -> None:
        """Take over what another consumer of this partition read and left (it died)."""
        await self._client.xautoclaim(
            self._keys.events(partition),
            GROUP,
            self._name,
            min_idle_time=self._claim_idle_ms,
            start_id="0-0",
            count=self._batch,
            justid=True,
        )

    @property
    def lag_s(self) -> float:
        return max(self._lag_s.values(), default=0.0)

    async def apply(self, partition: int, entries: list[Entry]) -> None:
        """Apply one batch of a partition's entries, then acknowledge them."""
        if not entries:
            self._lag_s[partition] = 0.0
            self._metrics.lag.set(self.lag_s)
            return
        started = time.perf_counter()
        self._lag_s[partition] = max(0.0, time.time() - entries[0].ms / 1000.0)
        self._metrics.lag.set(self.lag_s)
        batch = self._sort(entries)
        states = await self._states(batch.by_user)
        changes: dict[str, UserChange] = {}
        for user_id, events in batch.by_user.items():
            state = states[user_id]
            if isinstance(state, str):
                batch.dead.extend(_set_aside(batch, events, state))
                continue
            change = change_for(state, events, self._impressions_to_seen, self._world.refold)
            if change.blob is not None and not np.isfinite(change.blob).all():
                reason = "the folded-in vector is not finite"
                batch.dead.extend(_set_aside(batch, events, reason))
                continue
            changes[user_id] = change
        await self._write(changes, states)
        await self._dead_letters(partition, batch.dead)
        stream = self._keys.events(partition)
        await self._client.xack(stream, GROUP, *(entry.entry_id for entry in entries))
        await self._after(changes)
        self._count(changes, batch)
        self._metrics.batch_duration.observe(time.perf_counter() - started)

    def _sort(self, entries: list[Entry]) -> Sorted:
        by_user: dict[str, list[tuple[Event, int]]] = {}
        dead: list[SetAside] = []
        decoded: list[tuple[bytes, Event]] = []
        for entry in entries:
            try:
                events = decode_entry(entry.fields)
            except MalformedEventError as exc:
                dead.append(SetAside(entry.entry_id, entry.fields, DeadLetter.MALFORMED, str(exc)))
                continue
            for event in events:
                if isinstance(event, MalformedEventError):
                    kept = {b"event": str(event).encode()}
                    dead.append(SetAside(entry.entry_id, kept, DeadLetter.MALFORMED, str(event)))
                else:
                    decoded.append((entry.entry_id, event))
        positions = self._world.lookup([event.item_id for _, event in decoded])
        for (entry_id, event), position in zip(decoded, positions.tolist(), strict=True):
            if position < 0:
                why = "the catalog has no such item"
                dead.append(SetAside(entry_id, _kept(event), DeadLetter.UNKNOWN_ITEM, why))
            else:
                by_user.setdefault(event.user_id, []).append((event, position))
        return Sorted(by_user, dead, {id(event): entry_id for entry_id, event in decoded})

    async def _states(
        self, by_user: dict[str, list[tuple[Event, int]]]
    ) -> dict[str, UserState | str]:
        """Each user's state (a string says why it cannot be used), read by one script per
        group of users: the whole batch on one Redis, each user on a Cluster."""
        asked: list[tuple[str, list[int], list[str]]] = []
        for user_id, events in by_user.items():
            shown = sorted({p for e, p in events if e.type is EventType.IMPRESSION})
            asked.append((user_id, shown, [event.event_id for event, _ in events]))
        groups = [[one] for one in asked] if self._cluster else [asked]
        replies = await _bounded(self._read_states(group) for group in groups)
        states: dict[str, UserState | str] = {}
        for group, reply in zip(groups, replies, strict=True):
            at = 0
            for user_id, shown, ids in group:
                positives_raw, seen_raw, blob_raw = reply[at : at + 3]
                counts = reply[at + 3 : at + 3 + len(shown)]
                applied = reply[at + 3 + len(shown) : at + 3 + len(shown) + len(ids)]
                at += 3 + len(shown) + len(ids)
                states[user_id] = self._state(
                    positives_raw, seen_raw, blob_raw, shown, counts, ids, applied
                )
        return states

    async def _read_states(self, group: list[tuple[str, list[int], list[str]]]) -> list[Any]:
        keys: list[str] = []
        args: list[Any] = []
        for user_id, shown, ids in group:
            keys += self._user_keys(user_id)
            args += [len(shown), *shown, len(ids), *ids]
        return list(await self._read_script(keys=keys, args=args))

    def _user_keys(self, user_id: str) -> list[str]:
        """The keys both scripts take for a user, in their order."""
        keys = self._keys
        return [
            keys.positives(user_id),
            keys.seen(user_id),
            keys.user(user_id),
            keys.impressions(user_id),
            keys.applied(user_id),
        ]

    def _state(
        self,
        positives_raw: bytes | None,
        seen_raw: bytes | None,
        blob_raw: bytes | None,
        shown: list[int],
        counts: Any,
        ids: list[str],
        applied: list[bytes | None],
    ) -> UserState | str:
        seen, seen_whole = decode_seen(seen_raw)
        positives, positives_whole = decode_seen(positives_raw)
        if not (seen_whole and positives_whole):
            return "a seen list or positives list is torn (not whole uint32 positions)"
        size = self._world.size
        if (seen >= size).any() or (positives >= size).any():
            return "a stored list names positions past the catalog"
        blob = None
        if blob_raw is not None:
            if len(blob_raw) != self._world.blob_width * FLOAT32.itemsize:
                return (
                    f"the user blob is {len(blob_raw)} bytes, not {self._world.blob_width} floats"
                )
            blob = np.frombuffer(blob_raw, dtype=FLOAT32)
            if not np.isfinite(blob).all():
                return "the user blob holds NaN or Inf"
        impressions = {}
        if shown:
            impressions = {p: int(c) for p, c in zip(shown, counts, strict=True) if c is not None}
        return UserState(
            positives=positives if positives_raw is not None else seen,
            positives_stored=positives_raw is not None,
            seen=seen,
            blob=blob,
            impressions=impressions,
            applied=frozenset(i for i, hit in zip(ids, applied, strict=True) if hit is not None),
        )

    async def _write(self, changes: dict[str, UserChange], states: dict[str, Any]) -> None:
        """Every user's change in one script (atomic, as a transaction): the whole batch
        on one Redis, one script per user on a Cluster."""
        writing = [(user, change) for user, change in changes.items() if change.writes]
        if not writing:
            return
        groups = [[one] for one in writing] if self._cluster else [writing]
        await _bounded(self._write_group(group, states) for group in groups)

    async def _write_group(
        self, group: list[tuple[str, UserChange]], states: dict[str, Any]
    ) -> None:
        keys: list[str] = []
        args: list[Any] = [self._dedupe_s]
        for user_id, change in group:
            state: UserState = states[user_id]
            keys += self._user_keys(user_id)
            mode, positives = "", b""
            if change.positives and state.positives_stored:
                mode, positives = "A", encode_seen(change.positives)
            elif change.positives:
                whole = np.concatenate([state.positives, np.asarray(change.positives)])
                mode, positives = "S", encode_seen(whole)
            blob = b"" if change.blob is None else change.blob.astype(FLOAT32).tobytes()
            counts = [value for pair in change.impressions.items() for value in pair]
            reset = len(state.applied) + len(change.applied) > APPLIED_IDS_KEPT
            args += [encode_seen(change.seen) if change.seen else b"", mode, positives, blob]
            args += [len(change.impressions), *counts]
            args += [int(reset), len(change.applied), *change.applied]
        await self._write_script(keys=keys, args=args)

    async def _dead_letters(self, partition: int, dead: list[SetAside]) -> None:
        if not dead:
            return
        pipe: Any = self._client.pipeline(transaction=False)
        for aside in dead:
            fields = {**aside.payload, b"dead.reason": aside.reason.value, b"dead.why": aside.why}
            fields[b"dead.entry"] = aside.entry_id
            pipe.xadd(self._keys.dead_letters(partition), fields, maxlen=100_000, approximate=True)
            log.warning(
                "event of entry %s set aside (%s): %s",
                aside.entry_id.decode(),
                aside.reason,
                aside.why,
            )
        await pipe.execute()
        for aside in dead:
            self._metrics.dead_letter_count[aside.reason].inc()

    async def _after(self, changes: dict[str, UserChange]) -> None:
        """Trending counts and variant credits: after the transaction, at most once."""
        pairs = [pair for change in changes.values() for pair in change.trending]
        if pairs:
            args: list[Any] = []
            for position, ts_ms in pairs:
                args += [position, ts_ms / 1000.0 / self._half_life_s]
            await self._trending(keys=[self._keys.trending], args=args)
        credits = [credit for change in changes.values() for credit in change.credits]
        if credits:
            pipe: Any = self._client.pipeline(transaction=False)
            for request_id, _ in credits:
                pipe.get(self._keys.answer(request_id))
            variants = await pipe.execute()
            for (_, kind), variant in zip(credits, variants, strict=True):
                known = _variant(variant)
                if known is not None:
                    self._metrics.outcome_count[(known, kind)].inc()

    def _count(self, changes: dict[str, UserChange], batch: Sorted) -> None:
        counted = self._metrics.event_count
        counted[IngestOutcome.APPLIED].inc(sum(len(c.applied) for c in changes.values()))
        counted[IngestOutcome.DUPLICATE].inc(sum(c.duplicates for c in changes.values()))
        counted[IngestOutcome.DEAD_LETTER].inc(len(batch.dead))


# Scripts in flight at once on a Redis Cluster (one per user): within the client's pool.
CLUSTER_CALLS = 16


async def _bounded(calls: Iterable[Awaitable[T]]) -> list[T]:
    """The calls' results in order, at most CLUSTER_CALLS running at once."""
    gate = asyncio.Semaphore(CLUSTER_CALLS)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))


def _kept(event: Event) -> dict[bytes, bytes]:
    return {b"event": json.dumps(event.to_json()).encode()}


def _set_aside(batch: Sorted, events: list[tuple[Event, int]], reason: str) -> list[SetAside]:
    return [
        SetAside(batch.entry_of[id(event)], _kept(event), DeadLetter.BAD_STATE, reason)
        for event, _ in events
    ]


def _variant(raw: bytes | None) -> Variant | None:
    if raw is None:
        return None
    try:
        return Variant(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
