"""`recsys release world ...`: load, promote and roll back a candidate world on a running
service, through its /admin/worlds routes.

    recsys release world load --world /var/lib/recsys/worlds/next --prefix recsys-next \\
        --model ranking_model_next --percent 10
    recsys release world show
    recsys release world promote      # the candidate becomes stable for everyone
    recsys release world rollback     # the candidate is dropped: the stable world for all

Before `load`: the world's keys are in Redis under its prefix (`recsys load-redis --world DIR
--prefix P`), its model is on Triton under its name (`recsys install-model --model-name`),
and, with RECSYS_WORLDS_FILE set, the ingest consumer gives it its own consumer. The token is
RECSYS_ADMIN_TOKEN's, read from the environment or from --token-file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from app.core.errors import ConfigError

TIMEOUT_S = 120.0  # a load starts a whole world: files, checks, warm-up


def token_of(args: argparse.Namespace) -> str:
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    token = os.environ.get("RECSYS_ADMIN_TOKEN", "")
    if not token:
        raise ConfigError("set RECSYS_ADMIN_TOKEN or pass --token-file: /admin needs the token")
    return token


def _said(state: dict[str, Any]) -> str:
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


def _run(args: argparse.Namespace) -> None:
    body = None
    if args.action == "load":
        body = {
            "artifacts_dir": str(Path(args.world).resolve()),
            "key_prefix": args.prefix,
            "model_name": args.model,
            "percent": args.percent,
        }
    verb = "candidate" if args.action == "load" else args.action
    try:
        state = call(args.url, token_of(args), verb, body)
    except ConfigError as exc:
        print(f"recsys release world {args.action}: {exc}", file=sys.stderr)
        sys.exit(2)
    print(_said(state))


def add_world_verb(verbs: Any) -> None:
    world = verbs.add_parser(
        "world",
        help="load, promote or roll back a candidate world on a running service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    world.add_argument("action", choices=("show", "load", "promote", "rollback"))
    world.add_argument("--url", default="http://127.0.0.1:8080", help="the service")
    world.add_argument("--token-file", help="a file holding RECSYS_ADMIN_TOKEN")
    world.add_argument("--world", help="load: the candidate world's directory")
    world.add_argument("--prefix", help="load: its key prefix in Redis")
    world.add_argument("--model", help="load: its model's name on Triton (default: its schema's)")
    world.add_argument("--percent", type=float, default=10.0, help="load: its share of users")
    world.set_defaults(run=_checked)


def _checked(args: argparse.Namespace) -> None:
    if args.action == "load" and not (args.world and args.prefix):
        print("recsys release world load: --world and --prefix are needed", file=sys.stderr)
        sys.exit(2)
    _run(args)
