"""Where one process stands in the catalog's change log, and what brings its room to the
log's end (app.clients.catalog_log).

Batches are applied in order, each once. A batch this process cannot apply
(UnappliableBatchError: it does not decode, or a value does not fit the room) is skipped:
logged with its number, counted (`skipped`), and passed over, so that the ones after it
are applied; every process skips the same ones, as each checks them the same way. A number
read from an entry never takes the room past the log's own counter (read with each page):
one entry written by hand with a huge number cannot make every later batch look applied.

A log that was compacted starts with the parts of a fold (app.release.compaction), each
numbered with the fold's last batch: a process that holds less than that takes every part
(a put or a withdrawal applied again changes nothing), one that holds as much takes none,
and one part-way through a fold when the log is folded again takes all of the new one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from app.clients.catalog_log import CatalogLog, Logged, page_entries
from app.core.errors import UnappliableBatchError
from app.core.throttled_log import ThrottledLog
from app.release.arrivals import CatalogRoom, ChangeBatch

log = logging.getLogger(__name__)
regressions = ThrottledLog(log)


class LogReader:
    def __init__(
        self,
        changes: CatalogLog,
        room: CatalogRoom,
        skipped: Callable[[], None] = lambda: None,
    ) -> None:
        self._changes = changes
        self.room = room
        self._skipped = skipped
        self._after = "-"
        self._largest = 1  # the largest entry read yet, in bytes: what sizes a page
        self._taking = False  # the fold being read is news to this room
        self._unfinished = False  # a fold was left part-way (the log was folded again)

    @property
    def changes(self) -> CatalogLog:
        return self._changes

    async def catch_up(self, timeout_s: float) -> list[ChangeBatch]:
        """Apply every batch past the last one applied; returns those applied."""
        applied: list[ChangeBatch] = []
        while True:
            count = page_entries(self._largest)
            page = await self._changes.read(self._after, count, timeout_s)
            if page.head < self.room.seq:
                regressions.warning(
                    "behind",
                    "the catalog log's counter (%d) is behind what this process applied (%d): "
                    "Redis lost writes it had confirmed; restart the processes of this world",
                    page.head,
                    self.room.seq,
                )
            for entry in page.entries:
                self._largest = max(self._largest, entry.size)
                if self._news(entry):
                    batch = self._applied(entry, page.head)
                    if batch is not None:
                        applied.append(batch)
                self._after = entry.entry_id
            if len(page.entries) < count:
                return applied

    def _news(self, entry: Logged) -> bool:
        part = entry.part
        if part is None:
            return entry.seq == 0 or entry.seq > self.room.seq
        number, total = part
        if number == 0:
            self._taking = self._unfinished or entry.seq > self.room.seq
        self._unfinished = self._taking and number + 1 < total
        return self._taking

    def _applied(self, entry: Logged, head: int) -> ChangeBatch | None:
        seq = min(entry.seq, max(head, self.room.seq))
        try:
            batch = dataclasses.replace(entry.batch(), seq=seq)
            self.room.apply(batch)
        except UnappliableBatchError as exc:
            log.error("catalog change log: batch %d skipped, not applicable: %s", entry.seq, exc)
            self.room.skip(seq)
            self._skipped()
            return None
        return batch
