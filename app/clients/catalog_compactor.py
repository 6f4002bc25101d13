"""The catalog's change log kept small: replaced, once it holds many entries, by its fold
(app.release.compaction: each item once, as it stands), in one script that gives way to any
batch appended meanwhile. One process at a time does it (a short hold in Redis); every
process reads the fold as app.clients.catalog_reader says."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.clients.catalog_log import CatalogLog, Logged
from app.core.errors import UnappliableBatchError
from app.release.arrivals import ChangeBatch
from app.release.compaction import Fold, fold

log = logging.getLogger(__name__)
# How long a process may take to compact before another may try.
HOLD_S = 60.0
READ_ENTRIES = 500


async def compact(
    changes: CatalogLog, check: Callable[[ChangeBatch], None], timeout_s: float
) -> bool:
    """Replace the log by its fold; False when another process is at it, or a batch was
    appended while this one folded (the next try folds that too)."""
    if not await changes.hold_compaction(HOLD_S, timeout_s):
        return False
    entries = await _everything(changes, timeout_s)
    if not entries:
        return False
    folded = await asyncio.to_thread(_folded, entries, check)
    parts = folded.batches()
    replaced = await changes.replace(entries[-1].entry_id, parts, timeout_s)
    if replaced:
        log.info(
            "catalog change log compacted: %d entries into %d (%d items, %d withdrawn), up to "
            "batch %d",
            len(entries),
            len(parts),
            len(folded.puts),
            len(folded.withdrawn),
            folded.seq,
        )
    return replaced


async def _everything(changes: CatalogLog, timeout_s: float) -> list[Logged]:
    entries: list[Logged] = []
    after = "-"
    while True:
        page = await changes.read(after, READ_ENTRIES, timeout_s)
        entries += page
        if len(page) < READ_ENTRIES:
            return entries
        after = page[-1].entry_id


def _folded(entries: list[Logged], check: Callable[[ChangeBatch], None]) -> Fold:
    batches: list[ChangeBatch] = []
    skipped = 0
    for entry in entries:
        try:
            batches.append(entry.batch())
        except UnappliableBatchError:
            skipped += 1  # every process skips it: the fold leaves it out
    folded = fold(batches, check)
    folded.skipped += skipped
    return folded
