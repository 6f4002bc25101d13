"""Where a world's data lives in Redis: the keys of users, items, seen lists and the layout,
and of the real-time state the ingest consumer keeps beside them.

Part of the release: the loader writes these keys and the service reads them, and a prefix
lets two worlds share one Redis. Every key about one user carries the user id as its hash
tag (`recsys:u:{alice}`, `recsys:seen:{alice}`...), so on a Redis Cluster they share a slot
and the consumer can change them in one transaction. The event stream's partitions carry
their number as theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# The layout record's value for user keys as they are named now (hash-tagged by user).
USER_KEYS_FORMAT = "tagged"


# The ingest consumer group of the world whose keys share the streams' prefix.
INGEST_GROUP = "ingest"


@dataclass(frozen=True, slots=True)
class KeySpace:
    """`prefix`: the world's keys. `streams`: what every world served from one Redis shares
    (the event streams, the answer notes, the answer log); empty: the world's own prefix."""

    prefix: str
    streams: str = ""

    def __post_init__(self) -> None:
        for prefix in (self.prefix, self.streams):
            if "{" in prefix or "}" in prefix:
                raise ValueError(f"a key prefix cannot hold braces (hash tags): {prefix!r}")

    @property
    def _shared(self) -> str:
        return self.streams or self.prefix

    @property
    def ingest_group(self) -> str:
        """The consumer group that applies the events to this world: each world has its own,
        so every event reaches every world served beside the first."""
        if self._shared == self.prefix:
            return INGEST_GROUP
        return f"{INGEST_GROUP}:{self.prefix}"

    def user(self, user_id: str) -> str:
        return f"{self.prefix}:u:{{{user_id}}}"

    def seen(self, user_id: str) -> str:
        return f"{self.prefix}:seen:{{{user_id}}}"

    def positives(self, user_id: str) -> str:
        """The user's positives as uint32 catalog positions, oldest first (for the fold-in)."""
        return f"{self.prefix}:pos:{{{user_id}}}"

    def impressions(self, user_id: str) -> str:
        """A hash: item position -> impressions without a click so far."""
        return f"{self.prefix}:imp:{{{user_id}}}"

    def applied(self, user_id: str) -> str:
        """A hash of the ids of the user's applied events, expiring: a retried event
        changes nothing."""
        return f"{self.prefix}:ev:{{{user_id}}}"

    def item(self, item_id: str) -> str:
        return f"{self.prefix}:i:{item_id}"

    def events(self, partition: int) -> str:
        return f"{self._shared}:events:{{{partition}}}"

    def dead_letters(self, partition: int) -> str:
        return f"{self.prefix}:dead:{{{partition}}}"

    def answer(self, request_id: str) -> str:
        """What one answer was (its variant), expiring: clicks on it credit that variant."""
        return f"{self._shared}:ans:{request_id}"

    def catalog(self, world_id: str, part: str) -> str:
        """The world's catalog change log (`log`, a stream), its number of the last batch
        (`seq`) and the added items' positions (`positions`, a hash): one hash tag, so one
        script changes all three on a Redis Cluster too. A new world starts a new log. Beside
        them, the added items' showings and positives (`shown`, `chosen`: app.clients.exposure)."""
        return f"{self.prefix}:catalog:{{catalog-{world_id}}}:{part}"

    @property
    def shown(self) -> str:
        """The answer log: a stream of what answers showed, for the archive (app.archive)."""
        return f"{self._shared}:shown"

    @property
    def trending(self) -> str:
        """A sorted set: item position -> decayed count of positives (app.ingest.trending)."""
        return f"{self.prefix}:trending"

    @property
    def meta(self) -> str:
        return f"{self.prefix}:meta"

    def item_keys(self, item_ids: npt.NDArray[np.str_]) -> npt.NDArray[np.bytes_]:
        """Every item's key, encoded once, so a request only indexes into this array."""
        keys: npt.NDArray[np.bytes_] = np.char.encode(np.char.add(self.item(""), item_ids), "utf-8")
        return keys


def keyspace_of(prefix: str, streams: str) -> KeySpace:
    """The key space the settings name (RECSYS_REDIS_KEY_PREFIX, RECSYS_EVENT_KEY_PREFIX)."""
    return KeySpace(prefix, "" if streams == prefix else streams)
