"""The streams as the archive reads them: its own consumer group ("archive") on each event
partition and on the answer log, beside the ingest consumer's group, so each reads every
entry and acknowledges on its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from app.clients.feature_store import RedisClient

ARCHIVE_GROUP = "archive"
ACK_CHUNK = 5000


class ArchiveStream:
    def __init__(self, client: RedisClient, name: str, batch: int, block_ms: int) -> None:
        self._client = client
        self._name = name
        self._batch = batch
        self._block_ms = block_ms

    async def join(self, stream: str) -> None:
        """The group on `stream`, from its first entry kept (made with the stream if none)."""
        try:
            await self._client.xgroup_create(stream, ARCHIVE_GROUP, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, stream: str, after: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Entries after `after` among this consumer's pending ones, or new ones (">",
        waiting up to block_ms). Pending entries trimmed away come back with no fields."""
        block = None if after != ">" else self._block_ms
        answer: Any = await self._client.xreadgroup(
            ARCHIVE_GROUP, self._name, {stream: after}, count=self._batch, block=block
        )
        if not answer:
            return []
        _, messages = answer[0]
        return [(entry_id, dict(fields or {})) for entry_id, fields in messages]

    async def ack(self, stream: str, entry_ids: Sequence[bytes]) -> None:
        for start in range(0, len(entry_ids), ACK_CHUNK):
            await self._client.xack(stream, ARCHIVE_GROUP, *entry_ids[start : start + ACK_CHUNK])


def lost_group(exc: BaseException) -> bool:
    """The group is gone (Redis restarted empty, or the stream was deleted): join again."""
    return isinstance(exc, redis_errors.ResponseError) and "NOGROUP" in str(exc)
