"""`recsys`: the operator's command line: worlds, Redis, the local stack, and the server."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from app.cli import add_serve_options, serve
from app.errors import RecsysError


def _build_demo(args: argparse.Namespace) -> None:
    from app.schema import load_schema
    from recsys_tools.world.build import DEMO, LARGE, DemoSize, build_demo_world, install_model

    size = LARGE if args.large else DEMO
    size = DemoSize(args.items or size.items, args.users or size.users, size.impressions)
    schema = load_schema(args.schema)
    report = build_demo_world(args.world, schema, size, args.index_factory, args.seed)
    target = install_model(args.world, args.model_repository, schema.model_name)
    print(json.dumps({"world": str(args.world), "model": str(target), "training": report}))


def _import_catalog(args: argparse.Namespace) -> None:
    from app.schema import load_schema
    from recsys_tools.world.build import write_catalog
    from recsys_tools.world.importer import read_items, read_users

    schema = load_schema(args.schema)
    items, users = read_items(args.items, schema), read_users(args.users, schema)
    write_catalog(args.world, schema, items, users, args.index_factory)
    print(json.dumps({"world": str(args.world), "items": len(items.ids), "users": len(users.ids)}))


def _load_redis(args: argparse.Namespace) -> None:
    import redis
    from redis.cluster import RedisCluster

    from app.clients.feature_store import KeySpace
    from app.schema import load_schema
    from recsys_tools.world.redis_loader import load_world_into_redis

    client = (
        RedisCluster.from_url(args.redis_url)
        if args.cluster
        else redis.Redis.from_url(args.redis_url)
    )
    report = load_world_into_redis(
        args.world, client, load_schema(args.schema), KeySpace(args.prefix)
    )
    print(json.dumps({"items": report.items, "users": report.users, "seen": report.seen_lists}))


def _serve(args: argparse.Namespace) -> None:
    serve(args.workers, args.log_level, args.access_log)


def _demo(args: argparse.Namespace) -> None:
    from recsys_tools.demo import run_demo, stack_options

    run_demo(stack_options(args.world), args.host, args.port)


def _doctor(args: argparse.Namespace) -> None:
    from recsys_tools.doctor import run_doctor

    status = run_doctor(args)
    if status:
        raise SystemExit(status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recsys", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    world = argparse.ArgumentParser(add_help=False)
    world.add_argument("--world", type=Path, default=Path("var/world"), help="world directory")
    world.add_argument("--schema", type=Path, default=None, help="feature schema JSON")
    index = argparse.ArgumentParser(add_help=False)
    index.add_argument(
        "--index-factory", default="auto", help="FAISS factory string, or auto (Flat/IVF by size)"
    )

    build = commands.add_parser(
        "build-demo", parents=[world, index], help="synthetic catalog, users, index and model"
    )
    build.add_argument("--large", action="store_true", help="1M items, for benchmarks")
    build.add_argument("--items", type=int, default=0, help="override the item count")
    build.add_argument("--users", type=int, default=0, help="override the user count")
    build.add_argument("--seed", type=int, default=7)
    build.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    build.set_defaults(run=_build_demo)

    imported = commands.add_parser(
        "import-catalog", parents=[world, index], help="a real catalog from Parquet or NPZ"
    )
    imported.add_argument("--items", type=Path, required=True)
    imported.add_argument("--users", type=Path, required=True)
    imported.set_defaults(run=_import_catalog)

    load = commands.add_parser("load-redis", parents=[world], help="write blobs into Redis")
    load.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    load.add_argument("--prefix", default="recsys")
    load.add_argument(
        "--cluster", action="store_true", help="--redis-url names one node of a Redis Cluster"
    )
    load.set_defaults(run=_load_redis)

    served = commands.add_parser("serve", help="run the API (configured by RECSYS_* variables)")
    add_serve_options(served)
    served.set_defaults(run=_serve)

    demo = commands.add_parser("demo", parents=[world], help="local Redis + Triton + API")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8080)
    demo.set_defaults(run=_demo)

    from recsys_tools.doctor import add_doctor_options

    doctor = commands.add_parser(
        "doctor", help="check this GPU host (driver, SELinux, CDI, NUMA, ...) and the services"
    )
    add_doctor_options(doctor)
    doctor.set_defaults(run=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except RecsysError as exc:
        logging.getLogger("recsys").error("%s", exc)
        return 2
    return 0
