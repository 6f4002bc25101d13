"""Two worlds served side by side: the stable one, and a candidate for a share of users.

Each world is a whole Services (its index, catalog, held features, Redis keys, Triton model
and its own background tasks), started and checked exactly as at start-up before any user
sees it: a candidate that fails a check (schema, model, Redis layout, memory) is refused and
the stable world serves on. A request picks its world once, by a stable hash of the user id
(app.release.worlds.candidate_user), and runs wholly in it, so no answer mixes the two.
Promoting or rolling back swaps one reference: the next request of every user sees the
change at once; a retired world is closed once the requests it took have had their budget.

The worlds file (RECSYS_WORLDS_FILE) is the truth every worker converges to: /admin/worlds
writes it and converges here, then signals the other workers, which converge from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError, RecsysError
from app.core.metrics import ServiceMetrics
from app.core.outcomes import ReloadOutcome, WorldChange
from app.core.settings import Settings
from app.core.vocabulary import WorldRole
from app.process.reload import ReloadRefusedError
from app.process.services import Services
from app.process.world_tasks import stop_tasks, watch_task, world_tasks
from app.release.worlds import (
    WorldRef,
    WorldsPlan,
    candidate_user,
    read_worlds,
    world_settings,
    write_worlds,
)
from app.world.layout import NOT_LOADED
from app.world.manifest import manifest_items
from app.world.schema import world_schema

log = logging.getLogger(__name__)

StartWorld = Callable[[Settings], Awaitable[Services]]
# How long a retired world's requests may still run: their budget, and a margin for the
# answer's write-out, before its clients close under them.
RETIRE_MARGIN_S = 1.0
MEMINFO = Path("/proc/meminfo")
# What a loaded world takes beyond its arrays' bytes (decompressed files, the lookups built
# from them, allocator slack): measured, the API's resident memory grew 1.2x the sum on the
# demo world (loadtest/two_worlds.py).
MEMORY_OVERHEAD = 1.25


class WorldRefusedError(ConfigError):
    """The candidate failed a check, or there is nothing to promote; nothing changed."""


def world_memory_bytes(settings: Settings, items: int, blob_width: int) -> int:
    """What a world takes in memory, estimated: the files the service reads (the index, the
    catalog's arrays), plus the held item features, with room for the items added while
    serving (RECSYS_CATALOG_HEADROOM)."""
    files = sum(
        path.stat().st_size
        for path in settings.artifacts_dir.iterdir()
        if path.is_file() and path.name not in NOT_LOADED
    )
    held = 0
    if settings.item_features == "full":
        held = (items + settings.catalog_headroom) * blob_width * 4
    return int((files + held) * MEMORY_OVERHEAD)


def checked_memory(settings: Settings, reserve: float, meminfo: Path | None = None) -> int:
    """The world's memory estimate, once checked against what the host has available less
    `reserve` of it; ConfigError where it would take more."""
    world = settings.artifacts_dir
    if not world.is_dir():
        raise ConfigError(f"{world} is not a directory")
    schema = world_schema(world, settings.feature_schema)
    estimate = world_memory_bytes(settings, manifest_items(world), schema.item_blob_width)
    available = available_memory_bytes(meminfo or MEMINFO)
    if available is not None and estimate > int(available * (1.0 - reserve)):
        raise ConfigError(
            f"it would take about {estimate / 2**20:,.0f} MiB, and this host has "
            f"{available / 2**20:,.0f} MiB available, of which "
            f"RECSYS_WORLD_MEMORY_RESERVE={reserve:g} stays free"
        )
    log.info("world %s takes about %.0f MiB", world, estimate / 2**20)
    return estimate


def available_memory_bytes(meminfo: Path) -> int | None:
    """The host's MemAvailable; None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(slots=True)
class _Serving:
    services: Services
    ref: WorldRef | None
    tasks: list[asyncio.Task[None]]


@dataclass(frozen=True, slots=True)
class WorldsReport:
    stable: str  # the stable world's id
    stable_dir: str
    candidate: str  # the candidate's id; empty for none
    candidate_dir: str
    percent: float
    memory_bytes: int  # the candidate's estimate when loaded; 0 for none

    def said(self) -> str:
        if not self.candidate:
            return f"world {self.stable} serves everyone"
        return (
            f"world {self.stable} is stable; candidate world {self.candidate} answers "
            f"{self.percent:g}% of users"
        )


def _world_id(services: Services) -> str:
    return services.served.stamp.world_id if services.served.stamp is not None else "(unstamped)"


@dataclass
class Worlds:
    """The worlds this worker serves, and the one request -> world choice."""

    base: Settings
    metrics: ServiceMetrics
    start: StartWorld
    stable: _Serving
    candidate: _Serving | None = None
    percent: float = 0.0
    memory_bytes: int = 0
    # Changes are made one at a time: a load takes seconds, a second must not race it.
    changing: asyncio.Lock = field(default_factory=asyncio.Lock)
    retiring: set[asyncio.Task[None]] = field(default_factory=set)

    def serving(self, user_id: str) -> tuple[Services, WorldRole]:
        candidate = self.candidate  # read once: a swap between two reads cannot mix worlds
        if candidate is not None and candidate_user(user_id, self.percent):
            return candidate.services, WorldRole.CANDIDATE
        return self.stable.services, WorldRole.STABLE

    def report(self) -> WorldsReport:
        candidate = self.candidate
        return WorldsReport(
            stable=_world_id(self.stable.services),
            stable_dir=str(self.stable.services.settings.artifacts_dir),
            candidate=_world_id(candidate.services) if candidate else "",
            candidate_dir=str(candidate.services.settings.artifacts_dir) if candidate else "",
            percent=self.percent if candidate else 0.0,
            memory_bytes=self.memory_bytes if candidate else 0,
        )

    async def converge(self, plan: WorldsPlan) -> WorldsReport:
        """Serve what `plan` says: a promotion, a rollback, a new candidate or a new share.
        A world that fails its checks raises WorldRefusedError, and what served still does."""
        async with self.changing:
            if plan.stable != self.stable.ref:
                if self.candidate is not None and self.candidate.ref == plan.stable:
                    self._promote()
                else:
                    await self._replace_stable(plan.stable)
            if plan.candidate is None:
                if self.candidate is not None:
                    self._drop_candidate(WorldChange.ROLLBACK)
            elif self.candidate is None or self.candidate.ref != plan.candidate:
                await self._load(plan.candidate, plan.percent)
            self.percent = plan.percent if self.candidate is not None else 0.0
            self.metrics.candidate_world_percent.set(self.percent)
            report = self.report()
        log.info("worlds: %s", report.said())
        return report

    async def _started(self, ref: WorldRef | None, action: WorldChange) -> tuple[Services, int]:
        said = ref.said() if ref is not None else str(self.base.artifacts_dir)
        try:
            settings = world_settings(self.base, ref)
            memory = await asyncio.to_thread(
                checked_memory, settings, self.base.world_memory_reserve
            )
            services = await self.start(settings)
        except RecsysError as exc:
            raise self._refused(said, action, str(exc)) from None
        except Exception as exc:
            # A candidate's files come from a retrain job: one a reader fails on in its own
            # way (a library's error, not one of ours) refuses the candidate, and the stable
            # world serves on, rather than the worker failing at every start. A stable world
            # is no candidate: the same error there is a fault to see, not to serve around.
            if action is not WorldChange.LOAD:
                raise
            log.exception("world %s failed to start", said)
            raise self._refused(said, action, f"{type(exc).__name__}: {exc}") from None
        return services, memory

    def _refused(self, said: str, action: WorldChange, why: str) -> WorldRefusedError:
        self.metrics.world_change_count[(action, ReloadOutcome.REFUSED)].inc()
        log.error("world %s refused: %s", said, why)
        return WorldRefusedError(f"world {said} refused: {why}")

    async def _load(self, ref: WorldRef, percent: float) -> None:
        """The candidate started and checked, then swapped in for the one before, if any."""
        services, memory = await self._started(ref, WorldChange.LOAD)
        before = self.candidate
        self.candidate = _Serving(services, ref, world_tasks(services, stable=False))
        self.percent, self.memory_bytes = percent, memory
        if before is not None:
            self._retire(before)
        self.metrics.world_change_count[(WorldChange.LOAD, ReloadOutcome.APPLIED)].inc()

    def _promote(self) -> None:
        candidate = self.candidate
        assert candidate is not None
        old = self.stable
        candidate.tasks += watch_task(candidate.services)
        self.stable, self.candidate, self.percent = candidate, None, 0.0
        self._retire(old)
        self.metrics.world_change_count[(WorldChange.PROMOTE, ReloadOutcome.APPLIED)].inc()

    async def _replace_stable(self, ref: WorldRef | None) -> None:
        """A stable world named by the file that this worker does not serve yet (another
        worker promoted a candidate this one had refused, say): started, then swapped in."""
        services, _ = await self._started(ref, WorldChange.PROMOTE)
        old = self.stable
        self.stable = _Serving(services, ref, world_tasks(services))
        self._retire(old)
        self.metrics.world_change_count[(WorldChange.PROMOTE, ReloadOutcome.APPLIED)].inc()

    def _drop_candidate(self, action: WorldChange) -> None:
        candidate = self.candidate
        assert candidate is not None
        self.candidate, self.percent, self.memory_bytes = None, 0.0, 0
        self._retire(candidate)
        self.metrics.world_change_count[(action, ReloadOutcome.APPLIED)].inc()

    def _retire(self, serving: _Serving) -> None:
        """Close a world no request can pick any more, once those it took are done."""
        grace_s = serving.services.settings.request_budget_s + RETIRE_MARGIN_S

        async def retire() -> None:
            await stop_tasks(serving.tasks)
            await asyncio.sleep(grace_s)
            await serving.services.aclose()
            log.info("world %s closed", serving.services.settings.artifacts_dir)

        task = asyncio.create_task(retire(), name="retire-world")
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)

    async def aclose(self) -> None:
        await asyncio.gather(*self.retiring, return_exceptions=True)
        serving = [self.stable, *([self.candidate] if self.candidate else [])]
        for each in serving:
            await stop_tasks(each.tasks)
            await each.services.aclose()


async def open_worlds(settings: Settings, metrics: ServiceMetrics, start: StartWorld) -> Worlds:
    """The worlds the file names (or the settings' alone), started; a candidate the file
    names that fails its checks is logged and left out: the stable world serves everyone."""
    plan = read_worlds(settings.worlds_file)
    stable = await start(world_settings(settings, plan.stable))
    worlds = Worlds(settings, metrics, start, _Serving(stable, plan.stable, world_tasks(stable)))
    if plan.candidate is not None:
        try:
            await worlds.converge(plan)
        except WorldRefusedError:
            log.error("serving world %s alone", _world_id(stable))
    return worlds


async def change_worlds(worlds: Worlds, plan: WorldsPlan) -> WorldsReport:
    """Write `plan` to the worlds file, then serve it here. A refused candidate leaves the
    file as it was: the other workers never see it."""
    path = worlds.base.worlds_file
    if path is None:
        raise ConfigError("set RECSYS_WORLDS_FILE to serve two worlds")
    before = read_worlds(path)
    report = await worlds.converge(plan)
    if plan != before:
        write_worlds(path, plan)
    return report


def current_plan(worlds: Worlds) -> WorldsPlan:
    candidate = worlds.candidate
    return WorldsPlan(worlds.stable.ref, candidate.ref if candidate else None, worlds.percent)


def worlds_reload(worlds: Worlds) -> Callable[[], Coroutine[Any, Any, None]]:
    """What a reload signal does: the worlds file served again, then the stable world's
    release (its files, rules and model versions) reloaded. Each refusal is logged and
    counted where it happens; what served still does."""

    async def reload() -> None:
        try:
            await worlds.converge(read_worlds(worlds.base.worlds_file))
        except ConfigError as exc:
            log.error("the worlds file was not applied: %s", exc)
        with contextlib.suppress(ReloadRefusedError):
            await worlds.stable.services.served.reloader.reload()

    return reload
