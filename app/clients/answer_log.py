"""The answer log: what each answer showed (its items, their positions and scores), appended
to one Redis Stream for the archive (app.archive), which writes it to Parquet beside the
events. A ranker learns best from what was shown and what of it was chosen.

The request path pays one sampling draw and one list append; a task of the worker writes
what gathered, every RECSYS_ANSWER_LOG_FLUSH_MS, as one stream entry (one XADD for many
answers). The log is a sample, not a ledger: a Redis that does not take a flush loses that
flush (counted), and a worker whose buffer is full drops answers (counted) rather than grow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis import exceptions as redis_errors

from app.clients.feature_store import RedisClient
from app.core.outcomes import AnswerLogged as Logged
from app.release.keyspace import KeySpace

log = logging.getLogger("recsys.answer_log")
ANSWERS_FIELD = b"answers"
# Answers a worker holds before dropping: minutes of a busy worker's answers when Redis is
# away, a bounded few megabytes.
MAX_BUFFERED = 20_000
WRITE_TIMEOUT_S = 1.0


class ShownItem(Protocol):
    @property
    def item_id(self) -> str: ...

    @property
    def score(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Shown:
    """One answer as the request path hands it over: references only, encoded later."""

    answer_id: str
    ts_ms: int
    user_id: str
    page: str
    variant: str
    model_version: str
    world_id: str
    degraded: bool
    items: Sequence[ShownItem]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.answer_id,
            "ts": self.ts_ms,
            "u": self.user_id,
            "p": self.page,
            "v": self.variant,
            "m": self.model_version,
            "w": self.world_id,
            "d": int(self.degraded),
            "i": [item.item_id for item in self.items],
            # Four decimals are what a ranker can learn from; the rest is bytes.
            "s": [None if item.score is None else round(item.score, 4) for item in self.items],
        }


def encode_answers(shown: Sequence[Shown]) -> dict[str, str]:
    body = json.dumps([answer.to_json() for answer in shown], separators=(",", ":"))
    return {ANSWERS_FIELD.decode(): body}


Counted = Callable[[Logged, int], None]


class AnswerLog:
    def __init__(
        self,
        client: RedisClient,
        keys: KeySpace,
        sample: float,
        max_length: int,
        counted: Counted,
    ) -> None:
        self._client = client
        self._stream = keys.shown
        self._sample = sample
        self._max_length = max_length
        self._counted = counted
        self._buffer: list[Shown] = []

    def wanted(self) -> bool:
        """Whether this answer is in the sample (one draw; always at 1, never at 0)."""
        return self._sample >= 1.0 or (self._sample > 0.0 and random.random() < self._sample)

    def shown(self, answer: Shown) -> None:
        if len(self._buffer) >= MAX_BUFFERED:
            self._counted(Logged.DROPPED, 1)
            return
        self._buffer.append(answer)

    async def flush(self) -> None:
        """Write what gathered as one entry; on failure count it lost and go on."""
        if not self._buffer:
            return
        taken, self._buffer = self._buffer, []
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self._client.xadd(
                    self._stream,
                    encode_answers(taken),  # type: ignore[arg-type]
                    maxlen=self._max_length,
                    approximate=True,
                )
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:
            self._counted(Logged.FAILED, len(taken))
            log.debug("answer log: %d answers not written: %s", len(taken), exc)
            return
        self._counted(Logged.WRITTEN, len(taken))

    async def keep_flushing(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self.flush()

    async def aclose(self) -> None:
        await self.flush()
