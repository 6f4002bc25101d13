"""`recsys release world ...`: stage a candidate world, then load, promote and roll it back
on a running service, through its /admin/worlds routes.

    recsys release world stage --world /srv/recsys/worlds/next --redis-url redis://... \\
        --model-repository /srv/recsys/models          # names it recsys-ID, ranking_model_ID
    recsys release world load --world /srv/recsys/worlds/next --percent 10
    recsys release world show
    recsys release world promote      # the candidate becomes stable for everyone
    recsys release world rollback     # the candidate is dropped: the stable world for all
    recsys release world advance --worlds /srv/recsys/worlds --redis-url redis://... \
        --model-repository /srv/recsys/models --triton-url HOST:8001
                                      # the retrain's accepted world staged and loaded, once

`stage` writes the world's keys into Redis under its own prefix (as `recsys load-redis
--prefix`; the password from RECSYS_REDIS_PASSWORD) and installs its model into the
repository under its own name (as `recsys install-model --model-name`); with --triton-url a
Triton in explicit model-control mode loads it now (as `recsys model load`), otherwise
restart Triton. Both names default to the world's id, so `load` needs only --world. With
RECSYS_WORLDS_FILE set, the ingest consumer gives the loaded world a consumer of its own.
The token is RECSYS_ADMIN_TOKEN's, read from the environment or from --token-file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from app.core.errors import ConfigError, UnreachableError
from app.world.schema import checked_name
from recsys_tools.model.load import load_versions
from recsys_tools.world_advance import Advance, advance
from recsys_tools.worlds_client import call, candidate_names, said, stage, token_of


@contextmanager
def _loader(args: argparse.Namespace) -> Iterator[redis.Redis]:
    """Redis as the loader (its password from RECSYS_REDIS_PASSWORD); its errors as
    ConfigError naming it."""
    password = os.environ.get("RECSYS_REDIS_PASSWORD") or None
    client = redis.Redis.from_url(args.redis_url, username=args.redis_username, password=password)
    try:
        yield client
    except redis.RedisError as exc:
        raise ConfigError(f"Redis at {args.redis_url}: {exc}") from None
    finally:
        client.close()


def _stage(args: argparse.Namespace, prefix: str, model: str) -> None:
    if not (args.redis_url and args.model_repository):
        raise ConfigError("stage needs --redis-url and --model-repository")
    with _loader(args) as client:
        report = stage(Path(args.world), client, Path(args.model_repository), prefix, model)
    print(f"staged: {report.said()} under {prefix}:*, model {model} in {args.model_repository}")
    if args.triton_url:
        load_versions(args.triton_url, model, admin_key_env=args.admin_key_env)
        print(f"Triton at {args.triton_url} serves {model}")
    else:
        print("restart Triton to load it (or pass --triton-url to a Triton in explicit mode)")
    print(
        f"next: recsys release world load --world {args.world} --prefix {prefix} "
        f"--model {model} --percent 10"
    )


def _advance(args: argparse.Namespace) -> None:
    if not (args.worlds and args.redis_url and args.model_repository and args.triton_url):
        raise ConfigError(
            "advance needs --worlds, --redis-url, --model-repository and --triton-url (a "
            "Triton in explicit model-control mode: the candidate's model loads at once)"
        )
    plan = Advance(
        Path(args.worlds),
        args.url,
        token_of(args),
        Path(args.model_repository),
        args.triton_url,
        args.percent,
        args.admin_key_env,
    )
    with _loader(args) as client:
        print(advance(plan, client))


def _run(args: argparse.Namespace) -> None:
    if args.action == "advance":
        try:
            _advance(args)
        except (ConfigError, UnreachableError) as exc:
            print(f"recsys release world advance: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    body = None
    if args.action in ("load", "stage"):
        named = (args.prefix, args.model)
        prefix, model = named if all(named) else candidate_names(Path(args.world))
        prefix, model = args.prefix or prefix, args.model or model
        checked_name(model, "--model")  # a model directory is named by it
        if args.action == "stage":
            try:
                _stage(args, prefix, model)
            except ConfigError as exc:
                print(f"recsys release world stage: {exc}", file=sys.stderr)
                sys.exit(2)
            return
        body = {
            "artifacts_dir": str(Path(args.world).resolve()),
            "key_prefix": prefix,
            "model_name": model,
            "percent": args.percent,
        }
    verb = "candidate" if args.action == "load" else args.action
    try:
        state = call(args.url, token_of(args), verb, body)
    except ConfigError as exc:
        print(f"recsys release world {args.action}: {exc}", file=sys.stderr)
        sys.exit(2)
    print(said(state))


def add_world_verb(verbs: Any) -> None:
    world = verbs.add_parser(
        "world",
        help="load, promote or roll back a candidate world on a running service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    world.add_argument(
        "action", choices=("stage", "show", "load", "promote", "rollback", "advance")
    )
    world.add_argument("--url", default="http://127.0.0.1:8080", help="the service")
    world.add_argument("--token-file", help="a file holding RECSYS_ADMIN_TOKEN")
    world.add_argument("--world", help="stage, load: the candidate world's directory")
    world.add_argument("--worlds", help="advance: the retrain's --worlds (its candidate link)")
    world.add_argument("--prefix", help="stage, load: its key prefix (default: recsys-ID)")
    world.add_argument("--model", help="stage, load: its model's name (default: MODEL_ID)")
    world.add_argument("--redis-url", help="stage, advance: the Redis to write its keys into")
    world.add_argument("--redis-username", help="stage, advance: the loader's Redis user")
    world.add_argument("--model-repository", help="stage, advance: Triton's model repository")
    world.add_argument(
        "--triton-url", help="stage, advance: load the model now (explicit model control)"
    )
    world.add_argument("--admin-key-env", help="the variable holding Triton's admin key")
    world.add_argument("--percent", type=float, default=10.0, help="its share of users")
    world.set_defaults(run=_checked)


def _checked(args: argparse.Namespace) -> None:
    if args.action in ("load", "stage") and not args.world:
        print(f"recsys release world {args.action}: --world is needed", file=sys.stderr)
        sys.exit(2)
    _run(args)
