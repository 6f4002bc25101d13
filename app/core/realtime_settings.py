"""The real-time settings: the events API, who may post to it, and the ingest consumer.

Settings (settings.py) extends this class: the variables are one list, read together."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from app.core.callers import Callers, parse_callers


def seconds(ms: float) -> float:
    return ms / 1000.0


class RealtimeSettings(BaseSettings):
    # Real time: the events API and the ingest consumer (recsys-ingest)
    event_partitions: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="event streams, by user; each is applied in order by one consumer, so "
        "this is the most consumers that share the work. API and consumers must agree",
    )
    event_stream_max: int = Field(
        default=200_000,
        ge=1000,
        description="entries kept per stream, each a posted batch's share of the partition "
        "(trimmed approximately, oldest first)",
    )
    events_max_in_flight: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="POST /events batches one worker takes at once; more get a 503, so a "
        "burst of events never starves /recommend",
    )
    event_append_timeout_ms: float = Field(
        default=500.0, gt=0, description="the most appending one batch of events may take"
    )
    event_max_future_ms: float = Field(
        default=300_000.0,
        ge=0,
        description="an event stamped further ahead of this host's clock is refused",
    )
    event_max_age_ms: float = Field(
        default=7 * 86_400_000.0,
        gt=0,
        description="an event stamped further back than this is refused (listed in `stale`): "
        "a user's recency and trending are about now",
    )
    event_callers: SecretStr | None = Field(
        default=None,
        description="who may post /events: name=sha256:HEX entries, comma-separated (recsys "
        "event-caller NAME makes one); unset: /events answers loopback clients only",
    )
    event_caller_rate: float = Field(
        default=2000.0,
        gt=0,
        description="events a second each caller may post to one worker (a token bucket); "
        "more get a 429 with Retry-After",
    )
    event_caller_burst: int = Field(
        default=10_000,
        ge=500,
        description="events a caller may post at once above its rate (at least one full batch)",
    )
    trending_user_per_minute: int = Field(
        default=20,
        ge=0,
        description="a user's positives a minute that count toward trending; past it they "
        "still apply to the user, not to what every user is shown. 0: no limit",
    )
    online_user_ttl_s: int = Field(
        default=30 * 86_400,
        ge=0,
        description="a user the world did not hold, made by their events, is forgotten after "
        "this long without one (world users stay); 0: kept for good",
    )
    user_positives_kept: int = Field(
        default=500,
        ge=10,
        le=100_000,
        description="the latest positives kept per user (the fold-in reads them; older ones "
        "still count as seen)",
    )
    user_seen_kept: int = Field(
        default=20_000,
        ge=100,
        le=1_000_000,
        description="the latest seen items kept per user by the consumer: older ones may be "
        "recommended again",
    )
    impressions_to_seen: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="impressions of one item without a click or like before it counts as "
        "seen and is no longer recommended; 0: impressions never make an item seen",
    )
    trending_half_life_s: float = Field(
        default=3600.0, gt=0, description="how fast the trending counters of items decay"
    )
    trending_candidates: int = Field(
        default=50,
        ge=0,
        le=5000,
        description="the most trending items the popular source puts first; 0: none",
    )
    trending_refresh_ms: float = Field(
        default=1000.0, gt=0, description="how often each worker reads the trending items"
    )
    catalog_headroom: int = Field(
        default=20_000,
        ge=0,
        le=10_000_000,
        description="items that may be added to the catalog while serving (POST "
        "/catalog/items), held in every process's memory beside the world's; past it an "
        "addition is refused (409) until the next world takes them in. The same on every "
        "process of a deployment; 0: the catalog is the world's, changes refused (404)",
    )
    catalog_compact_entries: int = Field(
        default=1000,
        ge=10,
        description="entries of the catalog's change log past which it is compacted to each "
        "item's latest state (checked every 5 s, by one process at a time)",
    )
    catalog_follow_ms: float = Field(
        default=100.0,
        gt=0,
        description="how often each process reads the catalog's change log (a request that "
        "finds it ahead reads the rest before answering)",
    )
    prerank_newcomers: int = Field(
        default=10,
        ge=0,
        le=500,
        description="places among what pre-rank keeps given to items added while serving "
        "(the best by its score), so the ranker and exploration see them; 0: none reserved",
    )
    exposure_refresh_ms: float = Field(
        default=1000.0,
        gt=0,
        description="how often each process writes the showings of items added while serving "
        "and reads every process's back, with their positives: what exploration learns from",
    )
    arrival_candidates: int = Field(
        default=50,
        ge=0,
        le=5000,
        description="items added while serving that recall brings, nearest the user first",
    )
    answer_ttl_s: int = Field(
        default=3600,
        ge=0,
        description="how long an answer's variant is kept, for clicks that name its request "
        "id; 0: not kept (outcomes are not credited to variants)",
    )
    event_dedupe_s: int = Field(
        default=86_400,
        ge=60,
        description="how long the ids of a user's applied events are kept (the last 1024 at "
        "most), so a retried event within it changes nothing",
    )
    ingest_batch: int = Field(default=500, ge=1, le=10_000, description="events read at once")
    ingest_consumer: str = Field(
        default="0/1",
        pattern=r"^[0-9]+/[1-9][0-9]*$",
        description="i/n: this consumer applies the partitions p with p % n == i",
    )
    ingest_metrics_port: int = Field(
        default=9108, ge=0, le=65535, description="the consumer's /metrics; 0: none"
    )
    ingest_max_deliveries: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="failed tries of an entry before its events go to the dead letters "
        "(a failing batch is retried user by user first)",
    )
    ingest_claim_idle_ms: float = Field(
        default=30_000.0,
        gt=0,
        description="an event another consumer read and left unacknowledged this long is "
        "taken over",
    )

    @property
    def event_append_timeout_s(self) -> float:
        return seconds(self.event_append_timeout_ms)

    @property
    def trending_refresh_s(self) -> float:
        return seconds(self.trending_refresh_ms)

    @property
    def catalog_follow_s(self) -> float:
        return seconds(self.catalog_follow_ms)

    @property
    def exposure_refresh_s(self) -> float:
        return seconds(self.exposure_refresh_ms)

    @property
    def ingest_claim_idle_s(self) -> float:
        return seconds(self.ingest_claim_idle_ms)

    @property
    def ingest_share(self) -> tuple[int, int]:
        """(i, n) of `ingest_consumer`: this consumer's index among n."""
        index, count = (int(part) for part in self.ingest_consumer.split("/"))
        return index, count

    @field_validator("event_callers")
    @classmethod
    def _callers_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_callers(value.get_secret_value())
        return value

    @property
    def callers(self) -> Callers | None:
        text = self.event_callers
        return None if text is None else parse_callers(text.get_secret_value())
