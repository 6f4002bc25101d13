"""One request's trace: what each stage did to the candidates, for a sample of requests.

A trace is made only for a sampled request (RECSYS_TRACE_SAMPLE_PERCENT), or one that asks
for it (`debug: true`, or the X-Recsys-Trace header), and only while the debug pages are on:
an unsampled request pays one `is None` test a stage. Each stage writes its own record
through one interface (`Trace.record`): how many candidates came in and went out, what it
removed and why, its own tables and figures; the trace and the pages know no stage by name,
so a new stage needs no change here. What a record holds is small and bounded (counts, the
first ids of each list, the top 50 scored), turned into ids as it is recorded; kept traces
go into a ring of fixed length per process (`TraceRing`), with no I/O on the request path.
In explain mode a trace follows one item (`about`) through every stage, and `explain.py`
says where it left.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices, Positions, Scores

StrArray = npt.NDArray[np.str_]

FIRST_IDS = 10  # ids kept of each list a trace names (a source's, a filter's)
TOP_SCORED = 50  # scored candidates kept, best first, with their main features
NOT_FOLLOWED = -1


@dataclass(slots=True)
class Span:
    stage: str
    start_ms: float
    duration_ms: float
    candidates: int | None = None


@dataclass(slots=True)
class Followed:
    """What happened to the item an explain request follows, stage by stage."""

    source: str | None = None  # the first candidate source that brought it
    removed_by: str | None = None  # the filter that removed it
    prerank_rank: int | None = None  # its rank by the pre-rank score (1 = best)
    prerank_pool: int = 0
    prerank_keep: int = 0
    fetched: bool | None = None  # None: never reached fetch
    score: float | None = None
    model_rank: int | None = None  # its rank by the model's score among the scored
    served_rank: int | None = None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Table:
    """Rows a stage lists (a source's candidates, the scored, the answer), with the columns
    the page shows of them, in order."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class StageRecord:
    """What one stage did: candidates in and out, what it removed and why (a reason, how many,
    the first ids), its own tables by name, and a few figures."""

    came_in: int | None = None
    went_out: int | None = None
    removed: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, Table] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def remove(self, reason: str, removed: Positions, ids: ItemIds) -> None:
        self.removed.append(
            {"reason": reason, "count": len(removed), "first": first_ids(ids, removed)}
        )

    def table(self, name: str, title: str, columns: list[str]) -> Table:
        """The stage's table `name`, made empty on first use."""
        if name not in self.tables:
            self.tables[name] = Table(title, columns)
        return self.tables[name]


@dataclass(slots=True)
class Trace:
    request_id: str
    at: float  # wall clock, for the list
    request: dict[str, Any]
    began: float = field(default_factory=time.perf_counter)
    about: int = NOT_FOLLOWED  # the followed item's catalog position, in explain mode
    spans: list[Span] = field(default_factory=list)
    # By stage, in the order the stages first recorded.
    records: dict[str, StageRecord] = field(default_factory=dict)
    degraded: list[dict[str, str]] = field(default_factory=list)
    model: dict[str, str] = field(default_factory=dict)
    total_ms: float = 0.0
    followed: Followed = field(default_factory=Followed)

    def span(self, stage: str, started: float, elapsed_s: float) -> None:
        start_ms = (started - self.began) * 1000.0
        self.spans.append(Span(stage, round(start_ms, 3), round(elapsed_s * 1000.0, 3)))

    def counted(self, stage: str, candidates: int) -> None:
        for span in reversed(self.spans):
            if span.stage == stage:
                span.candidates = candidates
                return

    def fell_back(self, flag: str, cause: str) -> None:
        self.degraded.append({"flag": flag, "cause": cause[:300]})

    def record(self, stage: str) -> StageRecord:
        """The stage's record, made empty on first use: a stage writes what it did here."""
        if stage not in self.records:
            self.records[stage] = StageRecord()
        return self.records[stage]

    def rows(self, stage: str, table: str) -> list[dict[str, Any]]:
        """A stage's table's rows; none where the stage did not list them."""
        record = self.records.get(stage)
        found = None if record is None else record.tables.get(table)
        return [] if found is None else found.rows

    @property
    def follows(self) -> bool:
        return self.about != NOT_FOLLOWED

    def holds_followed(self, positions: Positions) -> bool:
        """Whether `positions` hold the item this trace follows (never outside explain)."""
        return self.follows and bool(np.any(positions == self.about))


def model_order(scores: Scores, positions: Positions) -> Indices:
    """Scored candidates best first by the model's own score, ties by catalog position, as
    rerank breaks them: the model's first N are the ones rerank starts from."""
    scored = np.flatnonzero(~np.isnan(scores))
    order: Indices = scored[np.lexsort((positions[scored], -scores[scored]))]
    return order


class ItemIds(Protocol):
    """What turns catalog positions into ids (the catalog)."""

    def ids_at(self, positions: Positions) -> npt.NDArray[np.str_]: ...


def first_ids(ids: ItemIds, positions: Positions) -> list[str]:
    return [str(i) for i in ids.ids_at(positions[:FIRST_IDS]).tolist()]


class TraceRing:
    """The latest traces of this process, at most `size`; sampling decides which are made."""

    def __init__(self, size: int, sample_percent: float, seed: int | None = None) -> None:
        self._kept: deque[Trace] = deque(maxlen=max(1, size))
        self._rate = sample_percent / 100.0
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def chosen(self, asked: bool) -> bool:
        """Whether to trace a request: asked for, or sampled."""
        return asked or (self._rate > 0.0 and self._random.random() < self._rate)

    def start(self, request_id: str, request: dict[str, Any], asked: bool) -> Trace | None:
        """A trace for this request, or None: unsampled and not asked for."""
        return Trace(request_id, time.time(), request) if self.chosen(asked) else None

    def keep(self, trace: Trace) -> None:
        trace.total_ms = round((time.perf_counter() - trace.began) * 1000.0, 3)
        with self._lock:
            self._kept.append(trace)

    def recent(self) -> list[Trace]:
        with self._lock:
            return list(reversed(self._kept))

    def find(self, request_id: str) -> Trace | None:
        with self._lock:
            return next((t for t in reversed(self._kept) if t.request_id == request_id), None)

    def __len__(self) -> int:
        return len(self._kept)
