"""Where one process stands in the catalog's change log, and what brings its room to the
log's end (app.clients.catalog_log).

Batches are applied in order, each once. A batch this process cannot apply
(UnappliableBatchError: it does not decode, or a value does not fit the room) is skipped:
logged with its number, handed to `skipped` (a counter), and passed over, so that the ones
after it are applied; every process skips the same ones, as each checks them the same way.

A log that was compacted starts with the parts of a fold (app.release.compaction), each
numbered with the fold's last batch: a process that holds less than that takes every part
(a put or a withdrawal applied again changes nothing), one that holds as much takes none.
Pages are sized by bytes, not entries: a part holds a thousand items.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.clients.catalog_log import CatalogLog, Logged
from app.core.errors import UnappliableBatchError
from app.release.arrivals import CatalogRoom, ChangeBatch

log = logging.getLogger(__name__)
# A page of the log at most about this many bytes, and this many entries.
PAGE_BYTES = 4 * 2**20
PAGE_ENTRIES = 500
FIRST_PAGE_ENTRIES = 16


class LogReader:
    def __init__(
        self,
        changes: CatalogLog,
        room: CatalogRoom,
        skipped: Callable[[int, str], None] | None = None,
    ) -> None:
        self._changes = changes
        self.room = room
        self._skipped = skipped
        self._after = "-"
        self._count = FIRST_PAGE_ENTRIES
        self._taking = False  # the fold being read is news to this room

    @property
    def changes(self) -> CatalogLog:
        return self._changes

    async def catch_up(self, timeout_s: float) -> list[ChangeBatch]:
        """Apply every batch past the last one applied; returns those applied."""
        applied: list[ChangeBatch] = []
        while True:
            count = self._count
            page = await self._changes.read(self._after, count, timeout_s)
            for entry in page:
                if self._news(entry):
                    batch = self._applied(entry)
                    if batch is not None:
                        applied.append(batch)
                self._after = entry.entry_id
            if page:
                average = sum(entry.size for entry in page) / len(page)
                self._count = max(1, min(PAGE_ENTRIES, int(PAGE_BYTES / max(average, 1.0))))
            if len(page) < count:
                return applied

    def _news(self, entry: Logged) -> bool:
        part = entry.part
        if part is None:
            return entry.seq == 0 or entry.seq > self.room.seq
        if part[0] == 0:
            self._taking = entry.seq > self.room.seq
        return self._taking

    def _applied(self, entry: Logged) -> ChangeBatch | None:
        try:
            batch = entry.batch()
            self.room.apply(batch)
        except UnappliableBatchError as exc:
            log.error("catalog change log: batch %d skipped, not applicable: %s", entry.seq, exc)
            self.room.skip(entry.seq)
            if self._skipped is not None:
                self._skipped(entry.seq, str(exc))
            return None
        return batch
