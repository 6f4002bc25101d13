"""The ingest consumer: reads the event log and applies it to what /recommend reads.

One task per partition this consumer owns (`p % n == i`), each reading its stream with the
consumer group, so a user's events apply in order and several consumers share the work.
A batch is applied in three steps, in this order:
1. every user's change (seen list, positives, impression counts, vector, the ids of the
   events applied) in one script, atomic like a transaction (app.ingest.user_store);
2. the events that could not be applied appended to the dead-letter stream, with why;
3. the batch acknowledged.
A consumer killed anywhere in between reads its unacknowledged events again when it comes
back (its pending list, by its stable name), and the ids it finds already applied change
nothing. Trending counts and variant credits come after the transaction: a crash just
then loses them for one batch (at most once), never doubles them.

No batch stalls a partition. Any failure sends the reader back to the pending entries; a
batch that fails whole is retried user by user, so one user's bad state holds only their
own events; an entry that failed RECSYS_INGEST_MAX_DELIVERIES times goes to the dead
letters with its reason. Only Redis being unreachable, loading, read-only or full
(transient) is waited out without counting toward that limit. A pending entry older than
the dedupe window is set aside rather than applied: its events may have applied already
and their ids been forgotten.

The streams are reached through app.clients.event_stream; this module is the loop and its
policy. The consumer follows the world: each batch checks the world id Redis holds, and when it is
another than the consumer's, the consumer loads the world's files again and applies
nothing until they are that world.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.clients.event_stream import Entry, EventStream, SetAside, transient
from app.core.events import (
    IngestOutcome,
)
from app.core.ingest_metrics import DeadLetter, IngestMetrics
from app.core.vocabulary import Variant
from app.ingest.apply import UserChange, UserState, change_for
from app.ingest.batch import Sorted, set_aside, sort_batch, split_stale
from app.ingest.refit import ItemRefits
from app.ingest.user_store import UserStore
from app.ingest.world import IngestWorld

log = logging.getLogger("recsys.ingest")
RETRY_S = 1.0
HOUSEKEEPING_S = 1.0
WORLD_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class Limits:
    impressions_to_seen: int
    half_life_s: float
    dedupe_s: int
    claim_idle_s: float
    max_deliveries: int
    trending_user_per_minute: int  # 0: no limit


class HeldError(Exception):
    """Entries left pending on purpose (a failure to retry, or a world still loading)."""


@dataclass(slots=True)
class _TrendingBudget:
    """Positives a user may add to trending this minute (one consumer sees all of a user's
    events: their partition is its own). Forgotten each minute, so it stays small."""

    per_minute: int
    minute: int = -1
    used: dict[str, int] = field(default_factory=dict)

    def allows(self, user_id: str, now_s: float) -> bool:
        if self.per_minute <= 0:
            return True
        minute = int(now_s // 60)
        if minute != self.minute:
            self.minute, self.used = minute, {}
        count = self.used.get(user_id, 0)
        self.used[user_id] = count + 1
        return count < self.per_minute


WorldLoader = Callable[[], Awaitable[IngestWorld]]


class Consumer:
    def __init__(
        self,
        stream: EventStream,
        world: IngestWorld,
        load_world: WorldLoader,
        store: UserStore,
        metrics: IngestMetrics,
        *,
        partitions: list[int],
        limits: Limits,
        refits: ItemRefits | None = None,
    ) -> None:
        self._stream = stream
        self._refits = refits
        self._world = world
        self._load_world = load_world
        self._store = store
        self._metrics = metrics
        self._partitions = partitions
        self._limits = limits
        self._lag_s: dict[int, float] = {p: 0.0 for p in partitions}
        self._pending: dict[int, int] = {p: 0 for p in partitions}
        self._claim_from: dict[int, str] = {p: "0-0" for p in partitions}
        self._failures: dict[bytes, int] = {}
        self._trending_budget = _TrendingBudget(limits.trending_user_per_minute)
        self._world_tried: tuple[str, float] = ("", 0.0)

    @property
    def world(self) -> IngestWorld:
        return self._world

    async def join(self) -> None:
        """Make the consumer group on every owned partition (from its first entry): events
        appended from now on are this consumer's to apply, even before `run` reads them."""
        await self._stream.ensure_groups(self._partitions)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume every owned partition until `stop` is set (a batch in hand is finished);
        `join` first."""
        tasks = [asyncio.create_task(self._partition(p, stop)) for p in self._partitions]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _partition(self, partition: int, stop: asyncio.Event) -> None:
        # First what this consumer read before and never acknowledged (it died mid-batch).
        cursor = "0"
        next_chores = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_chores:
                    await self._chores(partition)
                    next_chores = time.monotonic() + HOUSEKEEPING_S
                entries, gone = await self._stream.read(partition, cursor)
                # Trimmed while pending: nothing left to apply.
                await self._stream.ack(partition, gone)
                if cursor == "0" and not entries:
                    if not gone:
                        cursor = ">"
                    continue
                await self.apply(partition, entries, redelivered=cursor == "0")
            except asyncio.CancelledError:
                raise
            except HeldError as exc:
                log.info("partition %d: %s; back to its pending entries in 1 s", partition, exc)
                cursor = "0"
                await asyncio.sleep(RETRY_S)
            except Exception as exc:
                kind = "transient" if transient(exc) else "error"
                self._metrics.failure_count[kind].inc()
                log.warning(
                    "partition %d: %s: %s; back to its pending entries in 1 s",
                    partition,
                    type(exc).__name__,
                    exc,
                )
                cursor = "0"
                await asyncio.sleep(RETRY_S)

    async def _chores(self, partition: int) -> None:
        """Once a second: take over what a dead consumer left, and count what is pending."""
        idle_ms = int(self._limits.claim_idle_s * 1000)
        claimed, following = await self._stream.claim(
            partition, idle_ms, self._claim_from[partition]
        )
        self._claim_from[partition] = following
        if claimed:
            await self.apply(partition, claimed, redelivered=True)
        self._pending[partition] = await self._stream.pending(partition)
        self._metrics.pending.set(sum(self._pending.values()))

    @property
    def lag_s(self) -> float:
        return max(self._lag_s.values(), default=0.0)

    async def apply(self, partition: int, entries: list[Entry], redelivered: bool = False) -> None:
        """Apply one batch of a partition's entries, then acknowledge what is done with.
        HeldError when some are left pending to be tried again."""
        if not entries:
            self._lag_s[partition] = 0.0
            self._metrics.lag.set(self.lag_s)
            return
        started = time.perf_counter()
        self._lag_s[partition] = max(0.0, time.time() - entries[0].ms / 1000.0)
        self._metrics.lag.set(self.lag_s)
        world = await self._current_world()
        await world.follow_catalog()
        stale_before_ms = (time.time() - self._limits.dedupe_s) * 1000.0
        fresh, stale = split_stale(entries, stale_before_ms if redelivered else None)
        batch = sort_batch(fresh, world.lookup)
        batch.dead += stale
        failed: dict[str, str] = {}
        changes: dict[str, UserChange] = {}
        try:
            changes = await self._apply_users(batch, world, list(batch.by_user))
        except Exception as exc:
            if transient(exc):
                raise
            self._metrics.failure_count["error"].inc()
            log.warning(
                "partition %d: the batch from %s failed whole (%s: %s); applying it user by user",
                partition,
                entries[0].entry_id.decode(),
                type(exc).__name__,
                exc,
            )
            changes, failed = await self._user_by_user(batch, world)
        held = self._held(batch, failed)
        # An entry tried again sets its events aside then, not twice.
        batch.dead = [aside for aside in batch.dead if aside.entry_id not in held]
        await self._dead_letters(partition, batch.dead)
        # Counted once written, before the acknowledgement: whoever sees the entries
        # acknowledged sees them counted (a batch whose ack fails comes back as duplicates).
        self._count(changes, batch)
        done = [entry.entry_id for entry in entries if entry.entry_id not in held]
        await self._stream.ack(partition, done)
        for entry_id in done:
            self._failures.pop(entry_id, None)
        self._metrics.batch_duration.observe(time.perf_counter() - started)
        if held:
            raise HeldError(f"{len(held)} entries from {min(held).decode()} failed, kept pending")

    async def _apply_users(
        self, batch: Sorted, world: IngestWorld, users: list[str]
    ) -> dict[str, UserChange]:
        """The users' changes, written; events of users whose state is damaged set aside
        (added to the batch's dead letters only once the rest is written)."""
        by_user = {user: batch.by_user[user] for user in users}
        states = await self._store.states(by_user, world)
        changes: dict[str, UserChange] = {}
        dead: list[SetAside] = []
        for user_id, events in by_user.items():
            state = states[user_id]
            if isinstance(state, str):
                dead.extend(set_aside(batch, events, DeadLetter.BAD_STATE, state))
                continue
            change = change_for(
                state,
                events,
                self._limits.impressions_to_seen,
                world.refold,
                self._store.positives_kept,
            )
            if change.blob is not None and not np.isfinite(change.blob).all():
                why = "the folded-in vector is not finite"
                dead.extend(set_aside(batch, events, DeadLetter.BAD_STATE, why))
                continue
            changes[user_id] = change
        await self._store.write(changes, _states_of(states))
        batch.dead.extend(dead)
        await self._after(changes)
        return changes

    async def _user_by_user(
        self, batch: Sorted, world: IngestWorld
    ) -> tuple[dict[str, UserChange], dict[str, str]]:
        changes: dict[str, UserChange] = {}
        failed: dict[str, str] = {}
        for user_id in batch.by_user:
            try:
                changes.update(await self._apply_users(batch, world, [user_id]))
            except Exception as exc:
                if transient(exc):
                    raise
                failed[user_id] = f"{type(exc).__name__}: {exc}"
        return changes, failed

    def _held(self, batch: Sorted, failed: dict[str, str]) -> set[bytes]:
        """The entries to try again: those holding a failed user's events, unless they have
        failed often enough, when those events go to the dead letters instead."""
        held: set[bytes] = set()
        tried: dict[bytes, int] = {}
        for user_id in failed:
            for entry_id in batch.entries_of(user_id):
                if entry_id not in tried:
                    tried[entry_id] = self._failures.get(entry_id, 0) + 1
        for entry_id, count in tried.items():
            self._failures[entry_id] = count
            if count < self._limits.max_deliveries:
                held.add(entry_id)
        for user_id, why in failed.items():
            given_up = [
                (event, position)
                for event, position in batch.by_user[user_id]
                if batch.entry_of[id(event)] not in held
            ]
            reason = f"failed {self._limits.max_deliveries} times: {why}"
            batch.dead.extend(set_aside(batch, given_up, DeadLetter.FAILED, reason))
        return held

    async def _current_world(self) -> IngestWorld:
        """The world Redis holds, loaded again from the files when Redis changed worlds;
        HeldError while the files are not that world yet."""
        found = await self._stream.world_id()
        current = self._world
        if not found or not current.world_id or found == current.world_id:
            return current
        tried, at = self._world_tried
        if tried != found or time.monotonic() - at >= WORLD_RETRY_S:
            self._world_tried = (found, time.monotonic())
            loaded = await self._load_world()
            if loaded.world_id == found:
                log.info("Redis holds world %s: following it (was %s)", found, current.world_id)
                self._world = loaded
                self._metrics.world_change_count["followed"].inc()
                return loaded
            self._metrics.world_change_count["waiting"].inc()
        raise HeldError(f"Redis holds world {found}, the files world {current.world_id}")

    async def _dead_letters(self, partition: int, dead: list[SetAside]) -> None:
        if not dead:
            return
        await self._stream.set_aside(partition, dead)
        first = dead[0]
        log.warning(
            "%d events set aside, the first from entry %s (%s): %s",
            len(dead),
            first.entry_id.decode(),
            first.reason,
            first.why[:300],
        )
        for aside in dead:
            self._metrics.dead_letter_count[aside.reason].inc()

    async def _after(self, changes: dict[str, UserChange]) -> None:
        """Trending counts and variant credits: after the transaction, at most once."""
        now = time.time()
        raised: list[tuple[int, float]] = []
        skipped = 0
        for user_id, change in changes.items():
            for position, ts_ms in change.trending:
                if self._trending_budget.allows(user_id, now):
                    raised.append((position, ts_ms / 1000.0 / self._limits.half_life_s))
                else:
                    skipped += 1
        if skipped:
            self._metrics.trending_skipped.inc(skipped)
        await self._stream.raise_trending(raised)
        world = self._world  # positives of items added while serving, for exploration
        await self._stream.count_chosen(world.world_id, [p for p, _ in raised if p >= world.size])
        if self._refits is not None:  # and their vectors follow who chose them
            await self._refits.chosen(world, changes)
        credits = [credit for change in changes.values() for credit in change.credits]
        variants = await self._stream.answers([answer_id for answer_id, _ in credits])
        for (_, kind), variant in zip(credits, variants, strict=True):
            known = _variant(variant)
            if known is None:
                self._metrics.credit_count["unknown"].inc()
            else:
                self._metrics.credit_count["credited"].inc()
                self._metrics.outcome_count[(known, kind)].inc()

    def _count(self, changes: dict[str, UserChange], batch: Sorted) -> None:
        counted = self._metrics.event_count
        counted[IngestOutcome.APPLIED].inc(sum(len(c.applied) for c in changes.values()))
        counted[IngestOutcome.DUPLICATE].inc(sum(c.duplicates for c in changes.values()))
        counted[IngestOutcome.DEAD_LETTER].inc(len(batch.dead))

    async def redis_memory(self) -> None:
        """Redis's used memory and its limit, for the alert before writes stop."""
        used, most = await self._stream.memory()
        self._metrics.memory["used"].set(used)
        self._metrics.memory["max"].set(most)


def _states_of(states: dict[str, UserState | str]) -> dict[str, Any]:
    return {user: state for user, state in states.items() if not isinstance(state, str)}


def _variant(raw: bytes | None) -> Variant | None:
    if raw is None:
        return None
    try:
        return Variant(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None
