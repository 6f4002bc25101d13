"""The catalog's change log kept small: once the batches past its last fold outnumber
RECSYS_CATALOG_COMPACT_ENTRIES, one process (a hold in Redis) folds it (app.release.compaction:
each item once, as it stands) and puts the fold in its place, with every entry appended
meanwhile after it, in one script: a fold never gives way to writes, however many come.
Every process reads the fold as app.clients.catalog_reader says."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from app.clients.catalog_log import CatalogLog, Logged
from app.core.cancelling import cancel_requested
from app.core.errors import FeatureStoreError, UnappliableBatchError
from app.release.arrivals import ChangeBatch
from app.release.compaction import Fold

log = logging.getLogger(__name__)
# How long a process may take to compact before another may try.
HOLD_S = 120.0


async def compact(
    changes: CatalogLog, check: Callable[[ChangeBatch], None], timeout_s: float
) -> bool:
    """Replace the log by its fold and what was appended while it was folded; False when
    another process is at it, or replaced the log since this one read it."""
    holder = uuid.uuid4().hex
    if not await changes.hold_compaction(holder, HOLD_S, timeout_s):
        return False
    try:
        folded, last_id, read = Fold(), "", 0
        async for page in changes.pages(timeout_s):
            batches = await asyncio.to_thread(_decoded, page, folded)
            await asyncio.to_thread(folded.fold, batches, check)
            last_id, read = page[-1].entry_id, read + len(page)
        if not last_id:
            return False
        parts = folded.batches()
        replaced = await changes.replace(last_id, parts, timeout_s)
    finally:
        await changes.let_go(holder, timeout_s)
    if replaced:
        log.info(
            "catalog change log compacted: %d entries into %d (%d items, %d withdrawn), up to "
            "batch %d",
            read,
            len(parts),
            len(folded.puts),
            len(folded.withdrawn),
            folded.seq,
        )
    return replaced


def _decoded(page: list[Logged], folded: Fold) -> list[ChangeBatch]:
    batches: list[ChangeBatch] = []
    for entry in page:
        try:
            batches.append(entry.batch())
        except UnappliableBatchError:  # every process skips it: the fold leaves it out
            folded.seq = max(folded.seq, entry.seq)
    return batches


async def keep_small(
    changes: CatalogLog,
    check: Callable[[ChangeBatch], None],
    measured: Callable[[int], None],
    every_s: float,
    most_entries: int,
    timeout_s: float,
) -> None:
    """Every `every_s`, the log's length measured (`measured`) and, once the batches past
    its last fold outnumber `most_entries`, the log compacted."""
    while not cancel_requested():
        await asyncio.sleep(every_s)
        try:
            entries, folded = await changes.length(timeout_s)
            measured(entries)
            if entries - folded > most_entries:
                await compact(changes, check, timeout_s)
        except FeatureStoreError as exc:
            log.warning("the catalog change log was not compacted: %s", exc)
        except Exception:  # the log grows meanwhile; following it goes on
            log.exception("the catalog change log was not compacted")
    raise asyncio.CancelledError
