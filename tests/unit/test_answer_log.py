"""The answer log's request-path side: one draw and one append; what a failed flush and a
full buffer do (counted, never raised into a request)."""

from __future__ import annotations

from typing import Any

from redis import exceptions as redis_errors

from app.clients import answer_log
from app.clients.answer_log import AnswerLog, Shown
from app.core.outcomes import AnswerLogged
from app.pipeline.types import RankedItem
from app.release.keyspace import KeySpace


class _Redis:
    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.added: list[tuple[str, dict[str, str]]] = []

    async def xadd(self, key: str, fields: dict[str, str], **_: Any) -> bytes:
        if self.failing:
            raise redis_errors.ConnectionError("Redis is away")
        self.added.append((key, fields))
        return b"1-0"


def _shown(n: int) -> Shown:
    items = [RankedItem("i1", 0.5), RankedItem("i2", None)]
    return Shown(f"{n:032x}", 1, "u1", "home", "stable", "1", "w1", False, items)


def _log(client: _Redis, sample: float = 1.0) -> tuple[AnswerLog, dict[AnswerLogged, int]]:
    counts = dict.fromkeys(AnswerLogged, 0)

    def counted(result: AnswerLogged, n: int) -> None:
        counts[result] += n

    return AnswerLog(client, KeySpace("recsys"), sample, 1000, counted), counts  # type: ignore[arg-type]


async def test_a_flush_writes_what_gathered_as_one_entry() -> None:
    client = _Redis()
    log, counts = _log(client)
    for n in range(5):
        log.shown(_shown(n))
    await log.flush()
    await log.flush()  # nothing left: no empty entry
    assert len(client.added) == 1
    assert client.added[0][0] == "recsys:shown"
    assert counts[AnswerLogged.WRITTEN] == 5


async def test_a_refused_flush_is_counted_and_the_request_path_goes_on() -> None:
    log, counts = _log(_Redis(failing=True))
    log.shown(_shown(1))
    await log.flush()
    assert counts[AnswerLogged.FAILED] == 1
    log.shown(_shown(2))  # still takes answers


async def test_a_full_buffer_drops_rather_than_grows(monkeypatch: Any) -> None:
    monkeypatch.setattr(answer_log, "MAX_BUFFERED", 3)
    log, counts = _log(_Redis())
    for n in range(5):
        log.shown(_shown(n))
    assert counts[AnswerLogged.DROPPED] == 2


def test_the_sample_is_drawn_per_answer() -> None:
    assert all(_log(_Redis(), 1.0)[0].wanted() for _ in range(100))
    assert not any(_log(_Redis(), 0.0)[0].wanted() for _ in range(100))
    tenth = _log(_Redis(), 0.1)[0]
    drawn = sum(tenth.wanted() for _ in range(10_000))
    assert 700 < drawn < 1300
