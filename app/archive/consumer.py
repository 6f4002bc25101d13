"""The archive's loop: read every event partition and the answer log with the archive's own
consumer group, gather the rows, write them (a durable part per day and kind), then
acknowledge the entries they came from.

Nothing is acknowledged before the file holding it is durable, so a kill at any point loses
nothing: the entries read and not acknowledged are this consumer's pending ones, read again
first when it comes back (by its stable name). A kill between the write and the
acknowledgement writes those rows twice; every read of the archive keeps each row once
(by event id, by answer id). A store that refuses a write (a full disk, an unreachable
bucket) keeps the rows in hand and is tried again at the next interval; while they wait, no
more is read than twice a write's worth, and the streams hold the rest (up to their caps).

So that no row can hold the writes up, each is checked as it is read (quarantine.py): one the
tables cannot hold, or stamped ahead of this process's clock by more than `max_future_s`, is
written apart with the same write, counted, and acknowledged with the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.archive.quarantine import Quarantined, table_of
from app.archive.rows import Kind, Rows, day_of
from app.archive.store import ArchiveStore
from app.clients.archive_stream import ArchiveStream, lost_group
from app.core.archive_metrics import ArchiveMetrics

log = logging.getLogger("recsys.archive")
RETRY_S = 1.0
TICK_S = 0.1
SAID = 5  # entries a line names of the rows a write kept apart


@dataclass(frozen=True, slots=True)
class Source:
    stream: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class Cadence:
    flush_s: float
    flush_rows: int
    compact_every_s: float


class _Gathered:
    """What was read and not yet written: the rows of each kind, the entries to acknowledge
    once they are written, and the time of the oldest."""

    def __init__(self) -> None:
        self.rows = {kind: Rows(kind) for kind in Kind}
        self.entries: dict[str, list[bytes]] = {}
        self.oldest_ms: int | None = None

    def __len__(self) -> int:
        # Rows kept apart too: a flood of them waits in memory like any other.
        return sum(len(rows) + len(rows.quarantined) for rows in self.rows.values())

    @property
    def empty(self) -> bool:
        return not any(self.entries.values())

    def add(
        self, source: Source, entries: list[tuple[bytes, dict[bytes, bytes]]], latest_ms: int
    ) -> None:
        rows = self.rows[source.kind]
        for entry_id, fields in entries:
            if fields:  # an entry trimmed while pending has none: nothing left to keep
                rows.add_entry(source.stream, entry_id, fields, latest_ms)
        self.entries.setdefault(source.stream, []).extend(entry_id for entry_id, _ in entries)
        first_ms = int(entries[0][0].split(b"-", 1)[0])
        self.oldest_ms = first_ms if self.oldest_ms is None else min(self.oldest_ms, first_ms)

    def put_back(self, later: _Gathered) -> None:
        """Gathered again after a failed write: this (older) first, then what came since."""
        for kind, rows in later.rows.items():
            for name, values in rows.columns.items():
                self.rows[kind].columns[name].extend(values)
            self.rows[kind].malformed += rows.malformed
            self.rows[kind].quarantined.extend(rows.quarantined)
        for stream, ids in later.entries.items():
            self.entries.setdefault(stream, []).extend(ids)
        if later.oldest_ms is not None:
            self.oldest_ms = min(self.oldest_ms or later.oldest_ms, later.oldest_ms)


class Archiver:
    def __init__(
        self,
        stream: ArchiveStream,
        store: ArchiveStore,
        metrics: ArchiveMetrics,
        sources: list[Source],
        cadence: Cadence,
        max_future_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stream = stream
        self._store = store
        self._metrics = metrics
        self._sources = sources
        self._cadence = cadence
        self._max_future_ms = int(max_future_s * 1000)
        self._clock = clock
        self._gathered = _Gathered()
        self._unacked: dict[str, list[bytes]] = {}
        self._late_s = 0.0

    async def join(self) -> None:
        for source in self._sources:
            await self._stream.join(source.stream)

    async def run(self, stop: asyncio.Event) -> None:
        """Archive until `stop` is set, then write what is in hand and return."""
        readers = [asyncio.create_task(self._read(source, stop)) for source in self._sources]
        try:
            await self._write_loop(stop)
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        await self.flush()

    async def _write_loop(self, stop: asyncio.Event) -> None:
        cadence = self._cadence
        due = time.monotonic() + cadence.flush_s
        compact_at = time.monotonic() + min(60.0, cadence.compact_every_s)
        while not stop.is_set():
            await asyncio.sleep(TICK_S)
            self._show_lag()
            now = time.monotonic()
            if now >= due or len(self._gathered) >= cadence.flush_rows:
                await self.flush()
                due = now + cadence.flush_s
            if now >= compact_at:
                await self.compact_past_days()
                compact_at = now + cadence.compact_every_s

    async def _read(self, source: Source, stop: asyncio.Event) -> None:
        after = "0"  # first what this consumer read before and never acknowledged
        while not stop.is_set():
            if len(self._gathered) >= 2 * self._cadence.flush_rows:
                await asyncio.sleep(TICK_S)  # the writes are behind: the stream holds the rest
                continue
            try:
                entries = await self._stream.read(source.stream, after)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if lost_group(exc):
                    log.warning("%s: the archive's group is gone; joining again", source.stream)
                    await _quietly(self._stream.join(source.stream))
                else:
                    log.warning("%s: %s: %s; again in 1 s", source.stream, type(exc).__name__, exc)
                await asyncio.sleep(RETRY_S)
                continue
            if after != ">":
                if not entries:
                    after = ">"
                    continue
                after = entries[-1][0].decode()
            if entries:
                now_ms = int(self._clock() * 1000)
                self._late_s = max(0.0, now_ms / 1e3 - int(entries[0][0].split(b"-")[0]) / 1e3)
                self._gathered.add(source, entries, now_ms + self._max_future_ms)

    def _show_lag(self) -> None:
        oldest = self._gathered.oldest_ms
        waiting = 0.0 if oldest is None else max(0.0, self._clock() - oldest / 1000.0)
        self._metrics.lag.set(max(waiting, self._late_s if oldest is not None else 0.0))
        self._metrics.buffered.set(len(self._gathered))

    async def flush(self) -> None:
        """Write what was gathered, then acknowledge it; on a refused write keep it all."""
        await self._ack_left_over()
        if self._gathered.empty:
            return
        taken, self._gathered = self._gathered, _Gathered()
        try:
            await asyncio.to_thread(self._write, taken)
        except Exception as exc:
            taken.put_back(self._gathered)
            self._gathered = taken
            self._metrics.write_count["failed"].inc()
            log.warning(
                "archive: %d rows not written (%s: %s); kept, tried again in %.0f s",
                len(taken),
                type(exc).__name__,
                exc,
                self._cadence.flush_s,
            )
            return
        self._metrics.write_count["written"].inc()
        self._metrics.last_write.set(time.time())
        for kind, rows in taken.rows.items():
            self._metrics.row_count[kind.value].inc(len(rows))
            self._metrics.malformed_count[kind.value].inc(rows.malformed)
            self._kept_apart(kind, rows.quarantined)
        for stream, ids in taken.entries.items():
            self._unacked.setdefault(stream, []).extend(ids)
        await self._ack_left_over()

    def _write(self, gathered: _Gathered) -> None:
        now_ms = int(self._clock() * 1000)
        for kind, rows in gathered.rows.items():
            if len(rows):
                self._store.write(kind, rows.table())
            if rows.quarantined:
                apart = table_of(rows.quarantined, now_ms)
                self._store.write_quarantined(kind, apart, day_of(now_ms))

    def _kept_apart(self, kind: Kind, quarantined: list[Quarantined]) -> None:
        """Counted, and said once a write for each reason, with the first few entries."""
        by_reason: dict[str, list[Quarantined]] = {}
        for each in quarantined:
            by_reason.setdefault(each.reason.value, []).append(each)
        for reason, kept in by_reason.items():
            self._metrics.quarantine_count[kind.value, reason].inc(len(kept))
            named = ", ".join(f"{q.stream} {q.entry}" for q in kept[:SAID])
            log.warning(
                "archive: %d %s rows kept apart (%s) under %s/quarantine, not archived: %s%s",
                len(kept),
                kind.value,
                reason,
                self._store.uri,
                named,
                "" if len(kept) <= SAID else f" and {len(kept) - SAID} more",
            )

    async def _ack_left_over(self) -> None:
        """Acknowledge what is written; what Redis does not take now is tried at the next
        write (the rows are safe; unacknowledged, they would only be written again)."""
        for stream in list(self._unacked):
            try:
                await self._stream.ack(stream, self._unacked[stream])
            except Exception as exc:
                log.warning("%s: acknowledgement put off: %s", stream, exc)
                continue
            del self._unacked[stream]

    async def compact_past_days(self) -> None:
        """Each day before today merged into one file, once it has more than one."""
        today = day_of(int(self._clock() * 1000))
        for kind in Kind:
            for day in await asyncio.to_thread(self._store.days, kind):
                if day >= today:
                    continue
                try:
                    merged, rows = await asyncio.to_thread(self._store.compact, kind, day)
                except Exception as exc:
                    self._metrics.compaction_count["failed"].inc()
                    log.warning("archive: %s of %s not compacted: %s", kind, day, exc)
                    continue
                if merged:
                    self._metrics.compaction_count["compacted"].inc()
                    log.info(
                        "archive: %s of %s: %d files into one, %d rows", kind, day, merged, rows
                    )


async def _quietly(step: Awaitable[None]) -> None:
    try:
        await step
    except Exception as exc:
        log.debug("not joined yet: %s", exc)
