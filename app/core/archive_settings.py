"""The settings of what keeps what users did: the API's answer log and the archive process
(recsys-archive). Settings (settings.py) extends this class through RealtimeSettings' line:
one list of variables, read together."""

from __future__ import annotations

from pydantic import Field

from app.core.realtime_settings import RealtimeSettings, seconds

# How far two hosts' clocks may disagree: NTP keeps them within milliseconds; a minute is
# room for a host whose sync lapsed, not for one whose clock was set days ahead.
CLOCK_SKEW_S = 60.0


class ArchiveSettings(RealtimeSettings):
    answer_log_sample: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="share of answers whose items, positions and scores are appended to the "
        "answer log for the archive (a ranker learns from what was shown); 0: none",
    )
    answer_log_flush_ms: float = Field(
        default=100.0,
        gt=0,
        description="each worker writes its logged answers to Redis this often, as one entry",
    )
    answer_log_max: int = Field(
        default=20_000,
        ge=100,
        description="entries the answer log's stream keeps (each is one worker's answers of "
        "one flush), oldest trimmed first: what the archive may fall behind by",
    )
    archive_uri: str = Field(
        default="var/archive",
        min_length=1,
        description="where recsys-archive writes its Parquet files, by day: a path on this "
        "host, or a URI pyarrow opens (s3://bucket/prefix, hdfs://...)",
    )
    archive_flush_s: float = Field(
        default=5.0,
        gt=0,
        description="the archive writes what it read at least this often (a file per day "
        "and kind), and acknowledges it only once the file is durable",
    )
    archive_flush_rows: int = Field(
        default=50_000,
        ge=1,
        description="rows read that make the archive write before its interval is up",
    )
    archive_batch: int = Field(
        default=1000, ge=1, le=100_000, description="stream entries the archive reads at once"
    )
    archive_compact_every_s: float = Field(
        default=3600.0,
        gt=0,
        description="how often the archive merges each past day's files into one, without "
        "duplicates",
    )
    archive_metrics_port: int = Field(
        default=9109, ge=0, le=65535, description="the archive's /metrics; 0: none"
    )

    @property
    def answer_log_flush_s(self) -> float:
        return seconds(self.answer_log_flush_ms)

    @property
    def archive_max_future_s(self) -> float:
        """How far ahead of the archive's clock a row may be stamped and still be archived:
        what the API accepts ahead of its own clock (RECSYS_EVENT_MAX_FUTURE_MS, as this
        process reads it), and the skew between the two hosts."""
        return seconds(self.event_max_future_ms) + CLOCK_SKEW_S
