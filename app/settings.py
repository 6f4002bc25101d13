"""Service configuration, read once from RECSYS_* environment variables and validated."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RECSYS_", extra="ignore", frozen=True)

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)

    # Dependencies
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis://host:port/db or unix:///path/to/socket",
    )
    redis_key_prefix: str = Field(default="recsys", min_length=1)
    redis_max_connections: int = Field(default=64, ge=1)
    redis_timeout_ms: float = Field(default=100.0, gt=0)
    triton_url: str = Field(default="127.0.0.1:8001", description="Triton gRPC host:port")
    model_name: str | None = Field(
        default=None, min_length=1, description="default: the feature schema's model name"
    )
    model_version: str = Field(default="", description="empty: Triton's latest ready version")

    # Artifacts
    artifacts_dir: Path = Path("var/world")
    feature_schema: Path | None = Field(default=None, description="default: the packaged schema")
    rules_file: Path | None = Field(default=None, description="default: the packaged rules")

    # Request path
    candidate_count: int = Field(default=1000, ge=1, le=5000)
    popular_candidates: int = Field(default=100, ge=0, le=5000)
    index_nprobe: int = Field(default=32, ge=1, le=65536)
    max_seen_items: int = Field(default=200, ge=0, le=5000)
    request_timeout_ms: float = Field(default=250.0, gt=0, le=10_000)
    recall_threads: int = Field(default=2, ge=1, le=64)

    # Start-up
    startup_timeout_s: float = Field(default=60.0, gt=0)
