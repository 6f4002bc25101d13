"""Prometheus metrics of the service. Every label takes values from a fixed, small set."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.core.callers import UNKNOWN
from app.core.collectors import (
    AGREEMENT_BUCKETS,
    CANDIDATE_BUCKETS,
    LATENCY_BUCKETS,
    Declared,
)
from app.core.errors import FailureKind
from app.core.events import EventOutcome
from app.core.outcomes import (
    AnswerLogged,
    EventPost,
    Outcome,
    Refusal,
    ReloadOutcome,
    ShadowOutcome,
    WorldChange,
)
from app.core.vocabulary import RedisWorld, Removal, Stage, Variant, Viewed, WorldRole

# The stages that have something to fall back from.
DEGRADABLE_STAGES = (Stage.FEATURES, Stage.RECALL, Stage.PRERANK, Stage.FETCH, Stage.RANK)
COUNTED_STAGES = (
    Stage.RECALL,
    Stage.FILTER,
    Stage.PRERANK,
    Stage.FETCH,
    Stage.RANK,
    Stage.RERANK,
)

# Every collector of the service, by the ServiceMetrics attribute that holds it.
DECLARED: dict[str, Declared] = {
    "stage_duration": Declared(
        Histogram,
        "recsys_stage_duration_seconds",
        "Time spent in each stage of /recommend.",
        ("stage",),
        buckets=LATENCY_BUCKETS,
    ),
    "request_duration": Declared(
        Histogram,
        "recsys_request_duration_seconds",
        "Time to answer /recommend, by outcome.",
        ("outcome",),
        buckets=LATENCY_BUCKETS,
    ),
    "requests": Declared(
        Counter, "recsys_requests", "Requests to /recommend, by outcome.", ("outcome",)
    ),
    "candidates": Declared(
        Histogram,
        "recsys_stage_candidates",
        "Candidates coming out of each stage.",
        ("stage",),
        buckets=CANDIDATE_BUCKETS,
    ),
    "removed": Declared(
        Counter,
        "recsys_filtered_candidates",
        "Candidates the filter stage removed, by reason.",
        ("reason",),
    ),
    "degraded": Declared(
        Counter,
        "recsys_degraded",
        "Stages that fell back instead of failing, by reason.",
        ("stage", "reason"),
    ),
    "cold_start": Declared(
        Counter, "recsys_cold_start_users", "Requests for users without stored features."
    ),
    "breaker": Declared(
        Gauge,
        "recsys_breaker_state",
        "Circuit breaker per dependency (redis; triton, or triton-N per "
        "endpoint): 0 closed, 1 open, 2 half-open.",
        ("dependency",),
        mode="livemax",
    ),  # with workers: the least closed among them
    "in_flight": Declared(
        Gauge,
        "recsys_in_flight_requests",
        "Requests to /recommend being handled (by all the workers).",
        mode="livesum",
    ),
    "admission_limit": Declared(
        Gauge,
        "recsys_admission_limit",
        "Requests to /recommend one worker takes on at once, adapted to latency "
        "(by all the workers).",
        mode="livesum",
    ),
    "refusals": Declared(
        Counter,
        "recsys_admission_refusals",
        "Requests to /recommend refused by admission (503), by why: loop_behind, full, no_slot.",
        ("reason",),
    ),
    "ready": Declared(
        Gauge,
        "recsys_ready",
        "1 when the last readiness check passed (with workers: in every worker).",
        mode="livemin",
    ),
    "workers": Declared(
        Gauge,
        "recsys_workers",
        "Worker processes started and serving on this instance's port.",
        mode="livesum",
    ),
    "item_refreshes": Declared(
        Counter,
        "recsys_item_features_refreshes",
        "Reloads of the item features held in memory: swapped, or failed (the "
        "held features keep serving).",
        ("outcome",),
    ),
    "items_without_features": Declared(
        Gauge,
        "recsys_items_without_features",
        "Catalog items with no usable features in the matrix held in memory.",
        mode="livemax",
    ),
    "model_answers": Declared(
        Counter,
        "recsys_model_answers",
        "Answers by the model variant that scored them (fallback: Triton did not).",
        ("variant",),
    ),
    "model_version": Declared(
        Gauge,
        "recsys_model_version_info",
        "1 for each routed model version: stable, canary and shadow (the release).",
        ("variant", "version"),
        mode="livemax",
    ),
    "canary_percent": Declared(
        Gauge,
        "recsys_canary_percent",
        "The share of users, in percent, that the canary version answers.",
        mode="livemax",
    ),
    "shadow_calls": Declared(
        Counter,
        "recsys_shadow_calls",
        "Shadow scorings of answered requests, by outcome.",
        ("outcome",),
    ),
    "shadow_agreement": Declared(
        Histogram,
        "recsys_shadow_agreement",
        "Share of the served model's top items that the shadow model ranks in its top too.",
        buckets=AGREEMENT_BUCKETS,
    ),
    "reloads": Declared(
        Counter,
        "recsys_reloads",
        "Reloads of the release (index, catalog, rules, model versions), by outcome.",
        ("outcome",),
    ),
    "events": Declared(
        Counter,
        "recsys_events",
        "Events posted to /events, by outcome (accepted: appended to the event log).",
        ("outcome",),
    ),
    "event_posts": Declared(
        Counter,
        "recsys_event_posts",
        "POST /events by caller (the configured names; loopback with none configured; "
        "unknown for a refused token) and outcome.",
        ("caller", "outcome"),
    ),
    "uncredited": Declared(
        Counter,
        "recsys_events_uncredited",
        "Events naming an answer id the service never issued: applied, credited to no variant.",
    ),
    "trending_refreshes": Declared(
        Counter,
        "recsys_trending_refreshes",
        "Reads of the trending items from Redis, by result.",
        ("result",),
    ),
    "catalog_changes": Declared(
        Counter,
        "recsys_catalog_changes",
        "Catalog changes this process applied from the change log: items put, withdrawn.",
        ("change",),
    ),
    "catalog_skipped": Declared(
        Counter,
        "recsys_catalog_batches_skipped",
        "Batches of the catalog's change log this process could not apply and passed over "
        "(a value its arrays cannot hold, or a position past its room): each is logged with "
        "its number.",
    ),
    "catalog_log_entries": Declared(
        Gauge,
        "recsys_catalog_log_entries",
        "Entries of the catalog's change log (batches, or the parts of its last compaction "
        "and the batches since): past RECSYS_CATALOG_COMPACT_ENTRIES it is compacted.",
        mode="livemax",
    ),
    "catalog_added": Declared(
        Gauge,
        "recsys_catalog_added_items",
        "Items added while serving that this process holds, and the room for them.",
        ("of",),
        mode="livemax",
    ),
    "page_requests": Declared(
        Counter,
        "recsys_page_requests",
        "Requests to /recommend by page (the schema's pages; others count as other) and the "
        "item the page shows: none (a feed), known, unknown (the feed served instead).",
        ("page", "viewed"),
    ),
    "slots": Declared(
        Counter,
        "recsys_answer_slots",
        "Items in /recommend's answers by page and how each got its slot: ranked (the "
        "ranking and the rules), explored (a newcomer a bandit gave one of the last slots).",
        ("page", "slot"),
    ),
    "redis_world": Declared(
        Gauge,
        "recsys_redis_world",
        "1 for what Redis holds against the served world: served, another (another world's "
        "load), unstamped (a load without a world id), none (no layout record: flushed, "
        "restarted empty, never loaded), unknown (Redis did not answer); 0 for the others.",
        ("state",),
        mode="livemax",
    ),
    "answer_log": Declared(
        Counter,
        "recsys_answer_log_answers",
        "Answers offered to the answer log (RECSYS_ANSWER_LOG_SAMPLE of them): written to its "
        "stream for the archive, dropped (the worker's buffer full), failed (Redis refused "
        "the flush).",
        ("result",),
    ),
    "world_age": Declared(
        Gauge,
        "recsys_world_age_seconds",
        "How long ago the world being served was built (from its id), refreshed every "
        "second; absent for a world built before stamping. What retraining keeps low.",
        mode="livemax",
    ),
    "world_answers": Declared(
        Counter,
        "recsys_world_answers",
        "Answers by the world that made them: the stable one, or the candidate served beside "
        "it to RECSYS_WORLDS_FILE's share of users.",
        ("world",),
    ),
    "world_changes": Declared(
        Counter,
        "recsys_world_changes",
        "Candidate worlds loaded, promoted and rolled back, by outcome (applied, or refused "
        "by a check with the stable world serving on).",
        ("action", "outcome"),
    ),
    "candidate_world_percent": Declared(
        Gauge,
        "recsys_candidate_world_percent",
        "The share of users the candidate world answers; 0 with none.",
        mode="livemax",
    ),
    "release_generation": Declared(
        Gauge,
        "recsys_release_generation",
        "How many releases this worker has served: 1 at start, one more per reload.",
        mode="livemax",
    ),
}


class ServiceMetrics:
    """The service's collectors, on a registry of their own so several apps can coexist."""

    stage_duration: Histogram
    request_duration: Histogram
    requests: Counter
    candidates: Histogram
    removed: Counter
    degraded: Counter
    cold_start: Counter
    breaker: Gauge
    in_flight: Gauge
    admission_limit: Gauge
    refusals: Counter
    ready: Gauge
    workers: Gauge
    item_refreshes: Counter
    items_without_features: Gauge
    model_answers: Counter
    model_version: Gauge
    canary_percent: Gauge
    shadow_calls: Counter
    shadow_agreement: Histogram
    reloads: Counter
    release_generation: Gauge
    redis_world: Gauge
    events: Counter
    event_posts: Counter
    uncredited: Counter
    trending_refreshes: Counter
    catalog_changes: Counter
    catalog_skipped: Counter
    catalog_log_entries: Gauge
    catalog_added: Gauge
    page_requests: Counter
    slots: Counter
    answer_log: Counter
    world_age: Gauge
    world_answers: Counter
    world_changes: Counter
    candidate_world_percent: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for attribute, declared in DECLARED.items():
            setattr(self, attribute, declared.make(self.registry))
        # Children bound once, for the fixed label values only: every series exists from the
        # first scrape (so rate() and absent() behave), requests skip the label lookup, and a
        # label value outside the set fails loudly instead of creating a series.
        self.stage_timer = {stage: self.stage_duration.labels(stage) for stage in Stage}
        self.stage_count = {stage: self.candidates.labels(stage) for stage in COUNTED_STAGES}
        self.request_timer = {o: self.request_duration.labels(o) for o in Outcome}
        self.request_count = {o: self.requests.labels(o) for o in Outcome}
        self.removed_count = {r: self.removed.labels(r) for r in Removal}
        self.refresh_count = {
            swapped: self.item_refreshes.labels("swapped" if swapped else "failed")
            for swapped in (True, False)
        }
        self.answer_count = {v: self.model_answers.labels(v) for v in Variant}
        self.shadow_count = {o: self.shadow_calls.labels(o) for o in ShadowOutcome}
        self.answer_log_count = {r: self.answer_log.labels(r) for r in AnswerLogged}
        self.reload_count = {o: self.reloads.labels(o) for o in ReloadOutcome}
        self.world_answer_count = {r: self.world_answers.labels(r) for r in WorldRole}
        self.world_change_count = {
            (a, o): self.world_changes.labels(a, o)
            for a in WorldChange
            for o in (ReloadOutcome.APPLIED, ReloadOutcome.REFUSED)
        }
        self.refusal_count = {r: self.refusals.labels(r) for r in Refusal}
        self.event_count = {o: self.events.labels(o) for o in EventOutcome}
        self.trending_count = {
            read: self.trending_refreshes.labels("read" if read else "failed")
            for read in (True, False)
        }
        self.degraded_count = {
            (stage, kind): self.degraded.labels(stage, kind)
            for stage in DEGRADABLE_STAGES
            for kind in FailureKind
        }
        self.catalog_change_count = {
            change: self.catalog_changes.labels(change) for change in ("put", "withdraw")
        }
        self.redis_world_state = {state: self.redis_world.labels(state) for state in RedisWorld}
        self.event_post_count: dict[tuple[str, EventPost], Any] = {}
        self._page_count: dict[tuple[str, Viewed], Any] = {}
        self._slot_count: dict[str, tuple[Any, Any]] = {}

    def know_callers(self, names: list[str]) -> None:
        """The event callers' series, bound once for the configured names."""
        for name in [*names, UNKNOWN]:
            for post in EventPost:
                self.event_post_count[(name, post)] = self.event_posts.labels(name, post)

    def note_redis_world(self, held: RedisWorld) -> None:
        """1 for what Redis holds now, 0 for every other state."""
        for state, gauge in self.redis_world_state.items():
            gauge.set(1 if state is held else 0)

    def page_request(self, page: str, viewed: Viewed) -> None:
        """Count a request on `page`: one of the schema's pages, a fixed set per world."""
        child = self._page_count.get((page, viewed))
        if child is None:
            child = self._page_count[page, viewed] = self.page_requests.labels(page, viewed)
        child.inc()

    def answer_slots(self, page: str, served: int, explored: int) -> None:
        """Count an answer's slots on `page` (one of the schema's pages): ranked, explored."""
        children = self._slot_count.get(page)
        if children is None:
            children = self._slot_count[page] = (
                self.slots.labels(page, "ranked"),
                self.slots.labels(page, "explored"),
            )
        children[0].inc(served - explored)
        if explored:
            children[1].inc(explored)

    def observe_request(self, outcome: Outcome, seconds: float) -> None:
        self.request_count[outcome].inc()
        self.request_timer[outcome].observe(seconds)
