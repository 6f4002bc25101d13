"""The services the API needs, checked the way its start-up checks them: Triton's model ready
and matching the feature schema, and Redis's blobs written with the schema's layout."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from app.clients.breaker import CircuitBreaker
from app.clients.feature_store import FeatureStore, connect_redis
from app.clients.ranking_model import connect_triton
from app.core.errors import FeatureStoreError, RankingModelError, SchemaError
from app.release.keyspace import KeySpace
from app.world.schema import FeatureSchema, signature_mismatches
from recsys_tools.doctor.findings import CheckOutcome, fail, ok
from recsys_tools.doctor.redis_memory import StreamBudget, judge, measure

SERVICE_TIMEOUT_S = 3.0
TRITON_LOGS = "systemctl status recsys-triton; journalctl -u recsys-triton"
# On the deployed host Triton and Redis listen on the containers' network only (deploy/quadlet);
# rootful Podman's bridge lets the host reach them at the containers' addresses.
ADDRESS_ON_NETWORK = "{{.NetworkSettings.Networks.recsys.IPAddress}}"


# Where the deployment's Redis listens for the host (deploy/quadlet/redis.conf).
REDIS_SOCKET = "/run/recsys-redis/redis.sock"


def on_network(container: str) -> str:
    return f"$(podman inspect --format '{ADDRESS_ON_NETWORK}' {container})"


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    redis_url: str
    key_prefix: str
    triton_url: str
    model_name: str
    model_version: str
    schema: FeatureSchema
    timeout_s: float = SERVICE_TIMEOUT_S
    event_partitions: int = 4
    event_stream_max: int = 200_000
    max_body_bytes: int = 128 * 1024


def redacted(url: str) -> str:
    """The URL without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{parts.username}:***" if parts.username else ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def check_triton(config: ServiceConfig) -> CheckOutcome:
    return asyncio.run(_triton(config))


def check_redis(config: ServiceConfig) -> CheckOutcome:
    return asyncio.run(_redis(config))


def check_redis_memory(config: ServiceConfig) -> CheckOutcome:
    return asyncio.run(_redis_memory(config))


async def _redis_memory(config: ServiceConfig) -> CheckOutcome:
    from redis import exceptions as redis_errors

    keys = KeySpace(config.key_prefix)
    client = connect_redis(config.redis_url, max_connections=4, timeout_s=config.timeout_s)
    streams = [keys.events(p) for p in range(config.event_partitions)]
    try:
        info, now = await measure(client, streams)
    except (redis_errors.RedisError, OSError) as exc:
        return fail(
            f"Redis at {redacted(config.redis_url)} did not say its memory: {exc}",
            "run the check as a user allowed INFO and MEMORY USAGE (the loader's), or see "
            "systemctl status recsys-redis",
        )
    finally:
        await client.aclose()
    budget = StreamBudget(config.event_partitions, config.event_stream_max, config.max_body_bytes)
    return judge(info, budget, now)


async def _triton(config: ServiceConfig) -> CheckOutcome:
    breaker = CircuitBreaker("triton", failures=5, open_s=1.0)
    client = connect_triton(config.triton_url, config.model_name, config.model_version, breaker)
    try:
        try:
            signature = await client.ready_signature(config.timeout_s)
        except RankingModelError as exc:
            return await _why_not_ready(config, exc)
    finally:
        await client.close()
    problems = signature_mismatches(config.schema, signature)
    if problems:
        return fail(
            f"model {config.model_name!r} version {signature.version} on Triton at "
            f"{config.triton_url} does not match the feature schema: {'; '.join(problems)}",
            "deploy a model that takes the schema's row (deploy/triton/gpu/ranking_model/"
            "config.pbtxt and the exported model.onnx), or point RECSYS_FEATURE_SCHEMA at the "
            "schema it was exported with",
        )
    return ok(
        f"Triton at {config.triton_url}: model {config.model_name!r} version "
        f"{signature.version} is ready and takes the schema's {config.schema.width} FP32 columns"
    )


async def _why_not_ready(config: ServiceConfig, error: Exception) -> CheckOutcome:
    """Tell an unreachable Triton from a missing model from one that failed to load."""
    import tritonclient.grpc.aio as triton_grpc
    from tritonclient.utils import InferenceServerException

    url, name = config.triton_url, config.model_name
    raw = triton_grpc.InferenceServerClient(url=url)
    try:
        try:
            await raw.is_server_live(client_timeout=config.timeout_s)
        except InferenceServerException as exc:
            return fail(
                f"Triton at {url} is unreachable: {exc}",
                f"{TRITON_LOGS}; check RECSYS_TRITON_URL or --triton-url, Triton's gRPC port "
                f"(from the host: --triton-url {on_network('recsys-triton')}:8001)",
            )
        try:
            index: dict[str, Any] = await raw.get_model_repository_index(
                as_json=True, client_timeout=config.timeout_s
            )
        except InferenceServerException:
            return fail(f"Triton at {url} is up but {error}", f"{TRITON_LOGS}: the model's error")
    finally:
        await raw.close()
    models = [m for m in index.get("models", []) if isinstance(m, dict)]
    listed = [m for m in models if m.get("name") == name]
    if not listed:
        served = ", ".join(sorted({str(m.get("name")) for m in models})) or "none"
        return fail(
            f"Triton at {url} has no model {name!r} (it has: {served})",
            "set RECSYS_MODEL_NAME (or --model-name) to the model it serves, or put "
            f"{name} in Triton's model repository",
        )
    if config.model_version and all(
        str(m.get("version", "")) != config.model_version for m in listed
    ):
        versions = "; ".join(
            f"{m.get('version', '?')} {m.get('state', '')}".strip() for m in listed
        )
        return fail(
            f"Triton at {url} has model {name!r} but not version {config.model_version} "
            f"(it has: {versions})",
            "set RECSYS_MODEL_VERSION to a version it has, or leave it empty for the latest",
        )
    states = "; ".join(
        " ".join(str(m.get(k, "")) for k in ("version", "state", "reason")).strip() for m in listed
    )
    return fail(
        f"model {name!r} on Triton at {url} is not ready: {states or error}",
        f"{TRITON_LOGS} for why it did not load (a TensorRT engine from another release, "
        "GPU memory, a config error)",
    )


async def _redis(config: ServiceConfig) -> CheckOutcome:
    url = redacted(config.redis_url)
    client = connect_redis(config.redis_url, max_connections=2, timeout_s=config.timeout_s)
    breaker = CircuitBreaker("redis", failures=5, open_s=1.0)
    keys = KeySpace(config.key_prefix)
    store = FeatureStore(client, config.schema, keys, breaker)
    try:
        await store.check_layout(config.timeout_s)
    except FeatureStoreError as exc:
        return fail(
            f"Redis at {url} did not answer: {exc}",
            "systemctl status recsys-redis; check RECSYS_REDIS_URL or --redis-url (from the "
            "host, through its socket: --redis-url "
            f"'unix://recsys-loader:PASSWORD@{REDIS_SOCKET}')",
        )
    except SchemaError as exc:
        return fail(
            f"Redis at {url}: {exc}",
            f"load the features with this schema: recsys load-redis --world WORLD --redis-url "
            f"{url} --prefix {config.key_prefix}; or point RECSYS_FEATURE_SCHEMA at the schema "
            "they were written with",
        )
    finally:
        await store.aclose()
    return ok(
        f"Redis at {url}: {keys.meta} matches the feature schema (version "
        f"{config.schema.version}, {config.schema.embedding_dim}-dimension embeddings)"
    )
