"""Service configuration, read once from RECSYS_* environment variables and validated.

The real-time settings (events, the ingest consumer) and the archive's are their own classes,
which this one extends: one list of variables, three modules."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from app.core.archive_settings import ArchiveSettings
from app.core.cascade import (
    CANDIDATE_COUNT,
    INDEX_NPROBE,
    POPULAR_CANDIDATES,
    PRERANK_KEEP,
    RECENT_DECAY,
    RECENT_ITEMS,
    SIMILAR_CANDIDATES,
    VIEWED_CANDIDATES,
)
from app.core.errors import ConfigError
from app.core.realtime_settings import seconds

MIN_TOKEN_CHARS = 16
SECRET_SETTINGS = frozenset({"admin_token", "debug_token", "event_callers", "redis_password"})
# Secrets are read from files here, one per setting, named like its variable in lower case
# (recsys_admin_token, recsys_redis_password): where podman mounts its secrets. A secret in
# a file is in neither the environment nor `podman inspect`; the variables still work.
SECRETS_DIR = Path("/run/secrets")


class Settings(ArchiveSettings):
    model_config = SettingsConfigDict(env_prefix="RECSYS_", extra="ignore", frozen=True)

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    docs: bool = Field(default=True, description="serve /docs (Swagger UI, no external assets)")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="worker processes on the one port (recsys-serve --workers overrides); "
        "their metrics are combined",
    )
    max_body_bytes: int = Field(
        default=128 * 1024,
        ge=1024,
        description="larger request bodies get a 413 (the largest valid /recommend body, "
        "500 excluded ids of 128 ASCII characters, is about 66 KB)",
    )
    catalog_max_body_bytes: int = Field(
        default=8 * 2**20,
        ge=1024,
        description="larger bodies on /catalog/items and /catalog/withdrawals get a 413 before "
        "they are read (1,000 items with a 128-number vector and a 512-character title each "
        "are about 3.5 MB)",
    )
    body_timeout_ms: float = Field(
        default=1000.0,
        gt=0,
        description="a request body not whole within this gets a 408 (a slow sender holds "
        "nothing meanwhile: admission comes after the body)",
    )

    # Admission: what one worker process takes on at once.
    min_in_flight: int = Field(
        default=2, ge=1, le=10_000, description="the adaptive in-flight limit's floor"
    )
    max_in_flight: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="the adaptive in-flight limit's ceiling; the limit itself follows latency",
    )
    max_queue_ms: float = Field(
        default=10.0,
        gt=0,
        description="the longest a request waits before work starts: for a slot, or unread "
        "while the event loop stays this far behind; then a 503",
    )

    # Deadlines
    request_budget_ms: float = Field(default=100.0, ge=10, le=10_000)
    min_budget_ms: float = Field(
        default=20.0, gt=0, description="the floor of a budget a client asks for by header"
    )
    reserve_ms: float = Field(
        default=10.0, ge=0, description="kept back from every stage for the fallbacks"
    )

    # Dependencies
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis://host:port/db or unix:///path/to/socket",
    )
    redis_cluster: bool = Field(
        default=False, description="RECSYS_REDIS_URL names one node of a Redis Cluster"
    )
    redis_username: str | None = Field(
        default=None, min_length=1, description="the Redis ACL user the service logs in as"
    )
    redis_password: SecretStr | None = Field(
        default=None,
        description="its password (best as the secret file recsys_redis_password); "
        "default: the one in RECSYS_REDIS_URL, if any",
    )
    redis_key_prefix: str = Field(default="recsys", min_length=1, pattern=r"^[^{}]+$")
    event_key_prefix: str = Field(
        default="",
        pattern=r"^[^{}]*$",
        description="the prefix of what every world in one Redis shares: the event streams, "
        "the answer notes, the answer log; empty: RECSYS_REDIS_KEY_PREFIX. A world served "
        "beside another (its own RECSYS_REDIS_KEY_PREFIX) names the other's here, and its "
        "ingest consumer then applies every event with a group of its own",
    )
    redis_max_connections: int = Field(default=64, ge=1)
    redis_timeout_ms: float = Field(
        default=25.0, gt=0, description="the most one Redis call may take, budget permitting"
    )
    triton_url: str = Field(
        default="127.0.0.1:8001",
        description="Triton gRPC host:port; several, comma-separated, are balanced",
        pattern=r"^[^,\s]+(,[^,\s]+)*$",
    )
    triton_timeout_ms: float = Field(
        default=50.0, gt=0, description="the most one ranking call may take, budget permitting"
    )
    model_name: str | None = Field(
        default=None, min_length=1, description="default: the feature schema's model name"
    )
    model_version: str = Field(default="", description="empty: Triton's latest ready version")
    release_file: Path | None = Field(
        default=None,
        description="TOML naming the stable, canary and shadow versions, read at start and "
        "at every reload; default: RECSYS_MODEL_VERSION alone",
    )
    worlds_file: Path | None = Field(
        default=None,
        description="TOML naming the stable world and a candidate served beside it to a "
        "share of users (docs/loop.md); written by /admin/worlds; default: the world these "
        "settings name, alone",
    )
    world_memory_reserve: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="the share of the host's available memory a candidate world must leave "
        "free: one that would take more is refused before it loads",
    )
    shadow_max_in_flight: int = Field(
        default=8, ge=1, description="shadow calls at once; past it requests go unshadowed"
    )
    triton_shared_memory: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="model inputs through system shared memory: auto uses it with each "
        "Triton that can map this host's /dev/shm and plain gRPC with the others; on "
        "refuses to start without it; off never tries",
    )

    # Circuit breakers, one per dependency
    breaker_failures: int = Field(
        default=5, ge=1, description="consecutive failures or timeouts that open a breaker"
    )
    breaker_open_ms: float = Field(
        default=500.0, gt=0, description="how long an open breaker waits before one probe"
    )

    # Fallback ranking in process when Triton cannot answer
    fallback_ranker: bool = Field(
        default=True, description="rank with onnxruntime in process; off: recall order"
    )
    fallback_model: Path | None = Field(
        default=None, description="the ONNX file; default: model.onnx in the artifacts directory"
    )

    # Artifacts
    # A symlink here, flipped to a new directory, is followed at the next reload.
    artifacts_dir: Path = Path("var/world")
    admin_token: SecretStr | None = Field(
        default=None,
        description="enables /admin (reload, rollback), for callers sending this bearer "
        "token of 16 characters or more; unset: no /admin at all",
    )
    debug_pages: bool = Field(
        default=False,
        description="serves /debug/: traces of recent requests and why an item was or was "
        "not served; only to callers with the debug token, or on loopback when none is set",
    )
    debug_token: SecretStr | None = Field(
        default=None,
        description="the bearer token of /debug/ (16 characters or more; apart from the admin "
        "token: who reads traces need not reload releases); unset: /debug/ on loopback only",
    )
    debug_explain_in_flight: int = Field(
        default=2,
        ge=1,
        le=64,
        description='"why not item X" runs at once per worker (each ranks a whole answer and '
        "scans the catalog); more get a 503",
    )
    trusted_proxies: str = Field(
        default="",
        description="comma-separated addresses (or networks) of the proxies whose "
        "X-Forwarded-For is believed; empty: none. A request that came through a proxy is "
        "never a loopback caller (the loopback rules of /events, /catalog and /debug/)",
    )
    trace_sample_percent: float = Field(
        default=1.0,
        ge=0.0,
        le=100.0,
        description="the share of requests traced while /debug/ is on; a request with "
        "debug: true or the X-Recsys-Trace header always is",
    )
    trace_ring_size: int = Field(
        default=200, ge=1, le=10_000, description="traces each worker keeps, the latest"
    )
    feature_schema: Path | None = Field(default=None, description="default: the packaged schema")
    rules_file: Path | None = Field(default=None, description="default: the packaged rules")

    # Request path
    candidate_count: int = Field(
        default=CANDIDATE_COUNT,
        ge=1,
        le=5000,
        description="nearest items to the user's vector that recall asks the index for; with "
        "the similar, trending and popular sources they make the pool pre-rank cuts down",
    )
    popular_candidates: int = Field(default=POPULAR_CANDIDATES, ge=0, le=5000)
    similar_candidates: int = Field(
        default=SIMILAR_CANDIDATES,
        ge=0,
        le=5000,
        description="the most items recall takes from the neighbours of the user's latest "
        "positives (a world built with neighbours); 0: none",
    )
    viewed_candidates: int = Field(
        default=VIEWED_CANDIDATES,
        ge=0,
        le=5000,
        description="on an item page, the most items recall takes around the item shown: its "
        "neighbours, then the items nearest its vector; 0: none",
    )
    recent_items: int = Field(
        default=RECENT_ITEMS,
        ge=0,
        le=200,
        description="the user's latest positives read with their features, for the similar "
        "source and the pre-rank score",
    )
    recent_decay: float = Field(
        default=RECENT_DECAY,
        gt=0,
        le=1,
        description="how much less each older positive counts in the similar source's score",
    )
    prerank_keep: int = Field(
        default=PRERANK_KEEP,
        ge=1,
        le=5000,
        description="candidates the in-process pre-rank keeps for the model to score",
    )
    index_nprobe: int = Field(default=INDEX_NPROBE, ge=1, le=65536)
    index_mmap: bool = Field(
        default=False,
        description="map the FAISS index file instead of reading it: workers share its pages; "
        "the file must then be replaced by a rename, never rewritten in place",
    )
    item_features: Literal["full", "off"] = Field(
        default="full",
        description="full: every item's features held in memory, kept current from Redis; "
        "off: read from Redis per request",
    )
    item_refresh_s: float = Field(
        default=5.0, gt=0, description="how often held item features check for a new load"
    )
    recall_threads: int = Field(
        default=0,
        ge=0,
        le=64,
        description="0: FAISS searches run on the event loop (cheapest while a search takes "
        "well under a millisecond); N: in a pool of N threads, for slower indexes",
    )
    recall_queue: int = Field(
        default=8, ge=1, description="with a pool: searches waiting or running; more fall back"
    )

    # Start-up and shutdown
    startup_timeout_s: float = Field(default=60.0, gt=0)
    drain_s: float = Field(
        default=3.0, ge=0, description="after SIGTERM: not ready, still serving, for this long"
    )
    shutdown_grace_s: float = Field(
        default=10.0, gt=0, description="then: the most in-flight requests get to finish"
    )

    # Operators set milliseconds; the code times in seconds. Converted here, once.
    @property
    def body_timeout_s(self) -> float:
        return seconds(self.body_timeout_ms)

    @property
    def max_queue_s(self) -> float:
        return seconds(self.max_queue_ms)

    @property
    def request_budget_s(self) -> float:
        return seconds(self.request_budget_ms)

    @property
    def reserve_s(self) -> float:
        return seconds(self.reserve_ms)

    @property
    def redis_timeout_s(self) -> float:
        return seconds(self.redis_timeout_ms)

    @property
    def triton_timeout_s(self) -> float:
        return seconds(self.triton_timeout_ms)

    @property
    def breaker_open_s(self) -> float:
        return seconds(self.breaker_open_ms)

    @property
    def triton_urls(self) -> list[str]:
        return self.triton_url.split(",")

    @field_validator("triton_shared_memory", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        # Once a plain switch: true and false still mean on and off.
        text = str(value).strip().lower()
        if text in {"true", "1", "yes"}:
            return "on"
        if text in {"false", "0", "no"}:
            return "off"
        return text

    @field_validator("trusted_proxies")
    @classmethod
    def _named_proxies(cls, value: str) -> str:
        for entry in filter(None, (part.strip() for part in value.split(","))):
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                network = None
            if network is None or network.prefixlen == 0:
                raise ValueError(
                    f"{entry!r} is not a proxy's address or network: name the proxies (every "
                    "address would believe anyone's X-Forwarded-For, and anyone could claim "
                    "to be 127.0.0.1)"
                )
        return value

    @field_validator("admin_token", "debug_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"must be {MIN_TOKEN_CHARS} characters or more")
        return value

    @model_validator(mode="after")
    def _budget_leaves_room(self) -> Settings:
        if self.min_budget_ms > self.request_budget_ms:
            raise ValueError("min_budget_ms must not exceed request_budget_ms")
        if self.reserve_ms >= self.min_budget_ms:
            raise ValueError("reserve_ms must be below min_budget_ms, or no stage has time")
        if self.min_in_flight > self.max_in_flight:
            raise ValueError("min_in_flight must not exceed max_in_flight")
        index, count = self.ingest_share
        if index >= count:
            raise ValueError(f"ingest_consumer {self.ingest_consumer}: i must be below n")
        return self


def _variable(location: tuple[int | str, ...]) -> str:
    return "RECSYS_" + "_".join(str(part) for part in location).upper() if location else "RECSYS_*"


def _shown(error: Any) -> str:
    """The value a setting was refused for; never a secret's, which would reach the log."""
    if not error["loc"] or error["loc"][0] in SECRET_SETTINGS:
        return ""
    return f" (got {error['input']!r})"


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment and secret files; a bad value is a ConfigError naming
    its variable."""
    secrets_dir = SECRETS_DIR if SECRETS_DIR.is_dir() else None
    try:
        return Settings(_secrets_dir=secrets_dir, **overrides)  # type: ignore[call-arg]
    except ValidationError as exc:
        problems = "; ".join(
            f"{_variable(error['loc'])}: {error['msg']}{_shown(error)}" for error in exc.errors()
        )
        raise ConfigError(f"bad setting: {problems}") from None
