"""Change what serves without a restart: the index, catalog and rules, and the model versions.

A reload builds the whole replacement beside the serving one (files read and checked, each
routed version checked against the schema and the world, and warmed by scoring rows), and
only then swaps the one reference requests read. Anything that fails a check refuses the
reload with one line saying why; nothing changes and the old release keeps serving.

What a reload may change, and what needs a restart: the world's files may be rebuilt (a new
index, new popularity) and the rules edited, but the items and the schema stay those of the
served world, since the held item features, the Redis data and the model are laid out by
them. A new world is served beside this one and promoted (app.process.worlds).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

from app.clients.triton_pool import TritonPool
from app.core.errors import (
    ConfigError,
    DependencyError,
    FailureKind,
    RankingModelError,
    RecsysError,
)
from app.core.metrics import ServiceMetrics
from app.core.outcomes import ReloadOutcome
from app.core.settings import Settings
from app.process.startup_checks import opened_catalog, opened_world, pool_signature
from app.release.added_cells import added_cells
from app.release.artifacts import ArtifactsRef, ServingArtifacts, artifacts_label, serving_artifacts
from app.release.catalog import Catalog, in_room
from app.release.keyspace import KeySpace
from app.release.plan import ModelRouting, ReleasePlan, Routed, read_plan, write_plan
from app.release.rules import load_rules
from app.release.world_match import files_identity
from app.world.schema import FeatureSchema
from app.world.stamp import WorldStamp

log = logging.getLogger(__name__)

RELOAD_SIGNAL = signal.SIGUSR1
# How long a reload waits for a version to be ready: it was meant to be ready already.
RELOAD_WAIT_S = 2.0
WARM_TIMEOUT_S = 10.0
WARM_REQUEST_ID = "warm-up"


class ReloadRefusedError(ConfigError):
    """The replacement failed a check; the release that was serving still is."""


@dataclass(frozen=True, slots=True)
class ReleaseReport:
    generation: int
    artifacts: str
    world_id: str
    stable: str
    canary: str
    canary_percent: float
    shadow: str

    def said(self) -> str:
        """The release in a sentence, for the log."""
        canary = (
            f"version {self.canary} takes {self.canary_percent:g}% of users"
            if self.canary
            else "no canary"
        )
        shadow = f"version {self.shadow} scores in the shadow" if self.shadow else "no shadow"
        return (
            f"release {self.generation} serves model version {self.stable} ({canary}, "
            f"{shadow}) on world {self.world_id or '(unstamped)'}, artifacts {self.artifacts}"
        )


async def warm(pool: TritonPool, routed: Routed, schema: FeatureSchema) -> None:
    """Score one full chunk on every Triton, as requests will: the first real request pays no
    first-use cost, and a version that cannot answer is found before any user is sent to it."""
    rows = np.zeros((routed.signature.max_batch_size, schema.width), np.float32)
    for endpoint in pool.endpoints:
        answer = await endpoint.score(rows, routed, WARM_TIMEOUT_S, WARM_REQUEST_ID, guarded=False)
        if routed.version and answer.version != routed.version:
            raise RankingModelError(
                FailureKind.BAD_DATA,
                f"{endpoint.url}: asked for version {routed.version}, {answer.version} answered",
            )


def _key(routed: Routed) -> str:
    return f"{routed.version}={routed.signature.version}"


async def _warm_new(
    pool: TritonPool,
    routing: ModelRouting,
    schema: FeatureSchema,
    serving: ModelRouting | None,
) -> None:
    """Warm each version not routed already. At start-up (nothing serving yet) a stable
    version that fails its warm-up is served all the same, as it passed the readiness and
    metadata checks start-up has always made; a new version that fails refuses the change."""
    known = {_key(each) for each in serving.routed()} if serving is not None else set()
    for routed in routing.routed():
        if _key(routed) in known:
            continue
        try:
            await warm(pool, routed, schema)
        except RankingModelError as exc:
            if serving is not None or routed is not routing.stable:
                raise
            log.warning("version %s failed its warm-up, served anyway: %s", _key(routed), exc)


async def _routed(
    pool: TritonPool,
    schema: FeatureSchema,
    world: WorldStamp | None,
    version: str,
    wait_s: float,
) -> Routed:
    signature = await pool_signature(pool, schema, world, wait_s, version)
    return Routed(version, signature)


async def model_routing(
    plan: ReleasePlan,
    pool: TritonPool,
    schema: FeatureSchema,
    world: WorldStamp | None,
    wait_s: float,
    serving: ModelRouting | None = None,
) -> ModelRouting:
    """Every version the plan names: ready on every Triton, fitting the schema and the world,
    and warmed unless `serving` (the routing requests use now) routes it already."""
    stable = await _routed(pool, schema, world, plan.stable, wait_s)
    canary = await _routed(pool, schema, world, plan.canary, wait_s) if plan.canary else None
    shadow = await _routed(pool, schema, world, plan.shadow, wait_s) if plan.shadow else None
    trials = {each.signature.version for each in (canary, shadow) if each is not None}
    if trials and not plan.stable:
        # "The latest" would follow a newer trial version: stable is pinned to what it is now.
        latest = stable.signature.version
        if latest in trials:
            raise ReloadRefusedError(
                f"the stable version is unpinned and the latest one ready is {latest}, the "
                "version on trial: pin the stable one (model.stable in the release file)"
            )
        stable = Routed(latest, stable.signature)
    routing = ModelRouting(stable, canary, plan.canary_percent if canary else 0.0, shadow)
    await _warm_new(pool, routing, schema, serving)
    return routing


def _same_items(new: Catalog, served: Catalog) -> None:
    if not np.array_equal(new.item_ids, served.item_ids):
        raise ReloadRefusedError(
            f"the new catalog holds other items ({new.size} against {served.size} served, or "
            "in another order): the item features and the model are laid out by the served "
            "world's items; serve a new world beside this one (recsys release world load), "
            "or restart onto it"
        )


def _versions(routing: ModelRouting) -> list[tuple[str, str]]:
    return [(role, _key(each)) for role, each in routing.named()]


def _same_release(new: ServingArtifacts, served: ServingArtifacts) -> bool:
    return (
        new.label == served.label
        and _versions(new.routing) == _versions(served.routing)
        and new.routing.canary_percent == served.routing.canary_percent
    )


def export_routing(
    metrics: ServiceMetrics, routing: ModelRouting, previous: ModelRouting | None = None
) -> None:
    """1 for each routed version; 0 for one no longer routed (with workers, a series cannot
    be removed, so the series of a version once routed stays, at 0)."""
    for routed_by, value in ((previous, 0), (routing, 1)):
        if routed_by is None:
            continue
        for role, routed in routed_by.named():
            metrics.model_version.labels(role, routed.signature.version).set(value)
    metrics.canary_percent.set(routing.canary_percent)


class Reloader:
    """Builds, checks and installs replacements, one at a time."""

    def __init__(
        self,
        settings: Settings,
        ref: ArtifactsRef,
        pool: TritonPool,
        keys: KeySpace,
        world: WorldStamp | None,
        metrics: ServiceMetrics,
        plan: ReleasePlan,
    ) -> None:
        self._settings = settings
        self._ref = ref
        self._pool = pool
        self._keys = keys
        self._world = world
        self._metrics = metrics
        self.plan = plan
        self._lock = asyncio.Lock()
        metrics.release_generation.set(ref.generation)
        export_routing(metrics, ref.current.routing)

    def report(self) -> ReleaseReport:
        current = self._ref.current
        routing = current.routing
        return ReleaseReport(
            generation=self._ref.generation,
            artifacts=current.label,
            world_id=self._world.world_id if self._world else "",
            stable=routing.stable.signature.version,
            canary=routing.canary.signature.version if routing.canary else "",
            canary_percent=routing.canary_percent,
            shadow=routing.shadow.signature.version if routing.shadow else "",
        )

    async def _artifacts(self, routing: ModelRouting) -> ServingArtifacts:
        """The replacement, built in a thread: reading the files, parsing the rules and
        sorting the catalog's ids take the event loop's time from requests otherwise."""
        return await asyncio.to_thread(self._build, routing, self._ref.current)

    def _build(self, routing: ModelRouting, served: ServingArtifacts) -> ServingArtifacts:
        """The files are read again only when they or the rules changed."""
        settings = self._settings
        stamp, schema = opened_world(settings)
        if schema != served.schema:
            raise ReloadRefusedError(
                f"{settings.artifacts_dir} is laid out by another feature schema than the "
                "served one: a new schema needs a new model; restart onto it"
            )
        served_id = self._world.world_id if self._world else ""
        if (stamp.world_id if stamp else "") != served_id:
            raise ReloadRefusedError(
                f"{settings.artifacts_dir} holds world {stamp.world_id if stamp else '(none)'}, "
                f"this service serves world {served_id or '(unstamped)'}: a new world is "
                "served beside this one (recsys release world load) or by restarting onto it "
                "(its Redis data and model change with it)"
            )
        rules = load_rules(settings.rules_file)
        identity = files_identity(settings.artifacts_dir, stamp)
        if artifacts_label(identity, rules) == served.label:
            return dataclasses.replace(served, routing=routing)
        catalog = opened_catalog(settings, schema)
        _same_items(catalog, served.catalog)
        if served.catalog.room is not None:
            # The same world: what its change log put and withdrew stays.
            catalog = in_room(catalog, served.catalog.room)
        return serving_artifacts(schema, catalog, rules, routing, self._keys, identity)

    async def _install(self, build: ServingArtifacts, plan: ReleasePlan) -> ReleaseReport:
        room = build.catalog.room
        if room is not None:
            if build.catalog.index is not self._ref.current.catalog.index:
                room.refile(added_cells(build.catalog.index, room.rows))
            # Built in a thread, its views may end short of batches applied since.
            build = dataclasses.replace(build, catalog=in_room(build.catalog, room))
        previous = self._ref.swap(build)
        self.plan = plan
        self._metrics.reload_count[ReloadOutcome.APPLIED].inc()
        self._metrics.release_generation.set(self._ref.generation)
        export_routing(self._metrics, build.routing, previous.routing)
        report = self.report()
        log.info("%s", report.said())
        return report

    def _refused(self, exc: Exception) -> ReloadRefusedError:
        self._metrics.reload_count[ReloadOutcome.REFUSED].inc()
        if isinstance(exc, ReloadRefusedError):
            refusal = exc
        elif isinstance(exc, RecsysError | DependencyError):
            refusal = ReloadRefusedError(str(exc))
        else:
            # A file the checks did not foresee (a truncated index, a corrupt array): the
            # replacement is refused like any other, and the error's kind named.
            refusal = ReloadRefusedError(f"{type(exc).__name__}: {exc}")
        log.error("reload refused, the serving release stays: %s", refusal)
        return refusal

    async def reload(self) -> ReleaseReport:
        """Read the release file, the world's files and the rules again, and serve them."""
        async with self._lock:
            try:
                plan = await asyncio.to_thread(
                    read_plan, self._settings.release_file, self._settings.model_version
                )
                current = self._ref.current
                routing = await model_routing(
                    plan, self._pool, current.schema, self._world, RELOAD_WAIT_S, current.routing
                )
                build = await self._artifacts(routing)
            except Exception as exc:  # anything wrong with the replacement refuses it
                raise self._refused(exc) from None
            if _same_release(build, self._ref.current):
                self.plan = plan
                self._metrics.reload_count[ReloadOutcome.UNCHANGED].inc()
                report = self.report()  # nothing changed: the generation stays
                log.info(
                    "reload: the files, rules and versions read again are those served: "
                    "generation %d stays",
                    report.generation,
                )
                return report
            return await self._install(build, plan)

    async def roll_back(self) -> ReleaseReport:
        """The stable version alone, at once; the release file says so too, so that a later
        reload, another worker or a restart does not bring the canary back."""
        async with self._lock:
            plan = self.plan.without_trials()
            current = self._ref.current
            routing = ModelRouting(current.routing.stable)
            if self._settings.release_file is not None:
                try:
                    await asyncio.to_thread(write_plan, self._settings.release_file, plan)
                except OSError as exc:
                    log.error("rolled back, but %s was not rewritten: %s", plan, exc)
            return await self._install(dataclasses.replace(current, routing=routing), plan)


class _EarlySignal:
    """Whether a reload signal came before the service could act on one."""

    came = False

    @classmethod
    def remember(cls, signum: int, frame: FrameType | None) -> None:
        cls.came = True


def hold_reload_signals() -> None:
    """From now until reload_on_signal takes over, a reload signal is remembered instead of
    killing the process (SIGUSR1's default); reload_on_signal then acts on it. Called as a
    process starts (`recsys-serve`, and each worker as it builds the app)."""
    with contextlib.suppress(ValueError):  # not the main thread: signals are not ours here
        signal.signal(RELOAD_SIGNAL, _EarlySignal.remember)


def reload_on_signal(reload: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """SIGUSR1 calls `reload` (`systemctl reload`, or another worker's /admin call); returns
    the undo.

    The reload runs as a task of the loop: a refused one is logged and counted, and the
    release that was serving keeps serving. A signal that came during start-up reloads now:
    start-up may have read the files before they changed.
    """
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[None]] = set()

    def handle() -> None:
        log.info("SIGUSR1: reloading the release")
        task = loop.create_task(reload(), name="reload")
        running.add(task)
        task.add_done_callback(running.discard)

    loop.add_signal_handler(RELOAD_SIGNAL, handle)
    if _EarlySignal.came:
        _EarlySignal.came = False
        handle()

    def undo() -> None:
        loop.remove_signal_handler(RELOAD_SIGNAL)
        for task in running:
            task.cancel()

    return undo
