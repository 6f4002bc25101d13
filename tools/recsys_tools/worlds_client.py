"""The calls `recsys release world ...` and the loop's jobs make: /admin/worlds on a running
service, and a world staged under its own names (its keys in Redis, its model in Triton's
repository)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import httpx
import redis

from app.core.errors import ConfigError
from app.release.keyspace import KeySpace
from app.world.schema import checked_name, is_name, world_schema
from app.world.stamp import read_stamp
from recsys_tools.world.store.identity import install_model, model_beside
from recsys_tools.world.store.redis_loader import LoadReport, load_world_into_redis

TIMEOUT_S = 120.0  # a load starts a whole world: files, checks, warm-up


def token_of(args: argparse.Namespace) -> str:
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    token = os.environ.get("RECSYS_ADMIN_TOKEN", "")
    if not token:
        raise ConfigError("set RECSYS_ADMIN_TOKEN or pass --token-file: /admin needs the token")
    return token


def said(state: dict[str, Any]) -> str:
    if not state["candidate"]:
        return f"world {state['stable']} ({state['stable_dir']}) serves every user"
    return (
        f"world {state['stable']} ({state['stable_dir']}) is stable; candidate world "
        f"{state['candidate']} ({state['candidate_dir']}) answers {state['percent']:g}% of "
        f"users and takes about {state['memory_bytes'] / 2**20:,.0f} MiB"
    )


def call(url: str, token: str, verb: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One /admin/worlds call; its JSON answer, or ConfigError with the service's reason."""
    headers = {"Authorization": f"Bearer {token}"}
    path = "/admin/worlds" if verb == "show" else f"/admin/worlds/{verb}"
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
            if verb == "show":
                response = client.get(path, headers=headers)
            else:
                response = client.post(path, headers=headers, json=body)
    except httpx.HTTPError as exc:
        raise ConfigError(f"{url} did not answer: {exc}") from None
    answer: dict[str, Any] = response.json() if response.content else {}
    if response.status_code == 404:
        raise ConfigError(f"{url} has no /admin: set RECSYS_ADMIN_TOKEN on the service")
    if response.status_code != 200:
        raise ConfigError(f"{verb}: {answer.get('message', response.text)}")
    return answer


def candidate_names(world: Path) -> tuple[str, str]:
    """The key prefix and model name a world is staged under by default: its id in both."""
    stamp = read_stamp(world)
    if stamp is None:
        raise ConfigError(f"{world} carries no world id: name --prefix and --model")
    # Both parts were checked as read (the manifest's id, the schema's model name); joined,
    # they may outgrow a name.
    model = f"{world_schema(world, None).model_name}_{stamp.world_id.replace('-', '_')}"
    if not is_name(model):
        raise ConfigError(f"{world}'s default model name {model!r} is too long: name --model")
    return f"recsys-{stamp.world_id}", model


def stage(
    world: Path, client: redis.Redis, repository: Path, prefix: str, model: str
) -> LoadReport:
    """The world's keys under `prefix`, its model in `repository` under `model`."""
    checked_name(model, "the model's name")  # before any key is written
    schema = world_schema(world, None)
    report = load_world_into_redis(world, client, schema, KeySpace(prefix))
    model_beside(repository, schema.model_name, model)
    install_model(world, repository, model)
    return report
