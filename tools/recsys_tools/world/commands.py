"""The world commands: build-demo, build-world, install-model, reindex, import-catalog,
load-redis. A world is a directory of files (catalog, index, model, stamp); see
docs/your-data.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from app.core.errors import ConfigError
from app.release.keyspace import KeySpace
from app.world.layout import REPORT_FILE
from app.world.schema import load_schema, world_schema
from recsys_tools.commands import Commands
from recsys_tools.world.flags import (
    add_engine_flags,
    add_item_table_flags,
    add_log_flags,
    item_columns,
    log_columns,
    positive_float,
)
from recsys_tools.world.judge.ablation import ITEM_FEATURES
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.neighbours import (
    EASE_BYTES,
    EASE_ITEM_RANGE,
    EASE_LAMBDA,
    EASE_LAMBDAS,
    EASE_MAX_ITEMS,
    NeighbourModel,
)
from recsys_tools.world.learn.ranker.net import NETWORKS
from recsys_tools.world.read.importer import read_items, read_users
from recsys_tools.world.recipes.capacity import check_fits, too_big
from recsys_tools.world.recipes.demo import DEMO, LARGE, DemoSize, build_demo_world
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe
from recsys_tools.world.store.catalog import write_catalog
from recsys_tools.world.store.identity import install_model, model_beside, stamp_world
from recsys_tools.world.store.redis_loader import (
    WORKERS,
    RedisUnreachableError,
    load_world_into_redis,
)
from recsys_tools.world.store.reindex import reindex_beside


def _build_demo(args: argparse.Namespace) -> None:
    size = LARGE if args.large else DEMO
    size = DemoSize(args.items or size.items, args.users or size.users, size.impressions)
    schema = load_schema(args.schema)
    if "order" in schema.sequence:
        raise ConfigError(
            "the demo world has no order model: give build-demo a schema without the order "
            "signal (build-world --order-model learns one from a log)"
        )
    report = build_demo_world(args.world, schema, size, args.index_factory, args.seed)
    result: dict[str, Any] = {"world": str(args.world), "training": report}
    if args.model_repository is not None:
        result["model"] = str(install_model(args.world, args.model_repository, schema.model_name))
    print(json.dumps(result))


def _neighbour_model(args: argparse.Namespace) -> NeighbourModel:
    for flag in ("ease_lambda", "ease_max_items"):
        if getattr(args, flag) is not None and args.neighbours != "ease":
            name = "--" + flag.replace("_", "-")
            raise ConfigError(f"{name} is EASE's: give it with --neighbours ease")
    lam = EASE_LAMBDA if args.ease_lambda is None else args.ease_lambda
    most = EASE_MAX_ITEMS if args.ease_max_items is None else args.ease_max_items
    return NeighbourModel(args.neighbours, lam, most)


def _build_world(args: argparse.Namespace) -> None:
    schema = load_schema(args.schema or interactions_schema_path())
    if args.engine == "spark" and (args.order_model or "order" in schema.sequence):
        # Before Spark starts: the refusal would otherwise come after the read and ALS.
        raise ConfigError(
            "the order model (--order-model, or a schema declaring the order signal) is "
            "learnt on the local engine only (--engine local)"
        )
    recipe = WorldRecipe(
        interactions=Path(args.interactions),
        columns=log_columns(args),
        items=args.items,
        item_columns=item_columns(args),
        item_features=args.item_features,
        compare_inputs=args.compare_inputs,
        keep_holdout=args.keep_holdout,
        seed=args.seed,
        index_factory=args.index_factory,
        network=args.network,
        regularization=args.als_regularization,
        neighbours=_neighbour_model(args),
        order_model=args.order_model,
    )
    if args.engine == "spark":
        report = _build_on_spark(recipe, args)
    else:
        check_fits(recipe.interactions, recipe.columns.layout)
        try:
            report = build_world_from_log(recipe, args.world, schema)
        except MemoryError:
            raise too_big(recipe.interactions, "it ran out of memory") from None
    print(evaluation_table(report))
    print(_inputs_table(report["inputs"]))
    print(f"\nThe world is in {args.world}; the full report in {args.world / REPORT_FILE}.")


def _build_on_spark(recipe: WorldRecipe, args: argparse.Namespace) -> dict[str, Any]:
    """The Spark engine, imported only when asked for: the local engine never needs pyspark."""
    try:
        from recsys_tools.world.recipes.on_spark import build_world_on_spark
        from recsys_tools.world.spark.session import SparkSettings, parse_conf
    except ImportError as exc:
        raise ConfigError(
            f"build-world --engine spark needs pyspark ({exc}): pip install "
            "'recsys-tools[spark]' (make setup installs it)"
        ) from None
    if args.spark_sample_rows < 1:
        raise ConfigError(f"--spark-sample-rows {args.spark_sample_rows}: give at least 1")
    settings = SparkSettings(args.spark_master, parse_conf(args.spark_conf), args.spark_sample_rows)
    schema = load_schema(args.schema or interactions_schema_path())
    # The log as given, not as a Path: hdfs:///logs/ or s3a://bucket/log/ keep their slashes.
    return build_world_on_spark(recipe, args.interactions, args.world, schema, settings)


def _figure(value: float | None) -> str:
    return f"{value:>10.4f}" if value is not None else f"{'-':>10}"


def evaluation_table(report: dict[str, Any]) -> str:
    """Each stage of the cascade on the list it would serve, then the baselines."""
    evaluation = report["evaluation"]
    lines = [f"{'':<14}{'in pool':>10}{'recall@10':>10}{'95% interval':>16}{'ndcg@10':>10}"]
    for name, figures in evaluation["stages"].items():
        lines.append(
            f"{name:<14}{_figure(figures['pool_share'])}{_figure(figures['recall@10'])}"
            f"{_interval_cell(figures.get('recall@10_interval'))}{_figure(figures['ndcg@10'])}"
        )
    for name in ("item_knn", "popularity"):
        figures = evaluation["methods"][name]
        lines.append(
            f"{name:<14}{'':>10}{_figure(figures['recall@10'])}"
            f"{_interval_cell(figures.get('recall@10_interval'))}{_figure(figures['ndcg@10'])}"
        )
    return "\n".join(lines)


def _interval_cell(bounds: list[float] | None) -> str:
    """A figure's 95% interval over resamples of the judged users; '-' for a report without."""
    return f"{bounds[0]:>9.4f}-{bounds[1]:.4f}" if bounds else f"{'-':>16}"


def _inputs_table(inputs: dict[str, Any]) -> str:
    """What each input bought: the ranked list's figures without it, and which were used."""
    rows = inputs["compared"]
    lines = [f"\nWhat each input bought (item table: {inputs['item_features']}):"]
    width = max(len(row["input"]) for row in rows) + 2
    lines.append(f"{'':<{width}}{'recall@10':>10}{'ndcg@10':>10}{'vs served':>10}")
    for row in rows:
        kept = "  (served)" if row["used"] else ""
        lines.append(
            f"{row['input']:<{width}}{_figure(row['recall@10'])}{_figure(row['ndcg@10'])}"
            f"{row['change']:>+10.4f}{kept}"
        )
    return "\n".join(lines)


def _install_model(args: argparse.Namespace) -> None:
    schema = world_schema(args.world, args.schema)
    if args.version < 1:
        raise ConfigError(f"--version {args.version}: Triton's versions start at 1")
    name = args.model_name or schema.model_name
    if name != schema.model_name:
        model_beside(args.model_repository, schema.model_name, name)
    print(install_model(args.world, args.model_repository, name, args.version))


def _reindex(args: argparse.Namespace) -> None:
    world_id = reindex_beside(args.world, args.out, args.index_factory)
    print(json.dumps({"world": str(args.out), "world_id": world_id}))


def _import_catalog(args: argparse.Namespace) -> None:
    schema = load_schema(args.schema)
    items, users = read_items(args.items, schema), read_users(args.users, schema)
    catalog = write_catalog(args.world, schema, items, users, args.index_factory)
    world_id = stamp_world(args.world, schema, **catalog.manifest())
    print(
        json.dumps(
            {
                "world": str(args.world),
                "world_id": world_id,
                "items": len(items.ids),
                "users": len(users.ids),
            }
        )
    )


def _load_redis(args: argparse.Namespace) -> None:
    schema = world_schema(args.world, args.schema)
    try:
        client = (
            RedisCluster.from_url(args.redis_url)
            if args.cluster
            else redis.Redis.from_url(args.redis_url)
        )
    except (ValueError, redis.RedisError) as exc:
        raise RedisUnreachableError(
            f"--redis-url {args.redis_url!r}: {exc} (redis://host:port/db or unix:///path)"
        ) from None
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1")
    report = load_world_into_redis(args.world, client, schema, KeySpace(args.prefix), args.workers)
    print(json.dumps({"items": report.items, "users": report.users, "seen": report.seen_lists}))


def register(commands: Commands) -> None:
    world = argparse.ArgumentParser(add_help=False)
    world.add_argument("--world", type=Path, default=Path("var/world"), help="world directory")
    world.add_argument("--schema", type=Path, default=None, help="feature schema JSON")
    index = argparse.ArgumentParser(add_help=False)
    index.add_argument(
        "--index-factory", default="auto", help="FAISS factory string, or auto (Flat/IVF by size)"
    )
    _add_build_demo(commands, world, index)
    _add_build_world(commands, index)
    _add_install_model(commands, world)
    _add_reindex(commands, world, index)
    _add_import_catalog(commands, world, index)
    _add_load_redis(commands, world)


def _add_build_demo(
    commands: Commands,
    world: argparse.ArgumentParser,
    index: argparse.ArgumentParser,
) -> None:
    build = commands.add_parser(
        "build-demo", parents=[world, index], help="synthetic catalog, users, index and model"
    )
    build.add_argument("--large", action="store_true", help="1M items, for benchmarks")
    build.add_argument("--items", type=int, default=0, help="override the item count")
    build.add_argument("--users", type=int, default=0, help="override the user count")
    build.add_argument("--seed", type=int, default=7)
    build.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="also install the model into this Triton repository (see install-model)",
    )
    build.set_defaults(run=_build_demo)


def _add_install_model(commands: Commands, world: argparse.ArgumentParser) -> None:
    install = commands.add_parser(
        "install-model",
        parents=[world],
        help="put the world's model, under its world id, into a Triton model repository",
    )
    install.add_argument(
        "--model-repository",
        type=Path,
        required=True,
        help="holds MODEL_NAME/config.pbtxt (copy model_repository/ or deploy/triton/gpu/)",
    )
    install.add_argument(
        "--model-name",
        help="install under this name, a second world's model beside the first (its config "
        "made from the schema's model's); default: the schema's model name",
    )
    install.add_argument(
        "--version",
        type=int,
        default=1,
        help="the Triton model version to write (default 1); a new one can be tried as a "
        "canary beside the served one (docs/changing-what-serves.md)",
    )
    install.set_defaults(run=_install_model)


def _add_reindex(
    commands: Commands,
    world: argparse.ArgumentParser,
    index: argparse.ArgumentParser,
) -> None:
    reindex = commands.add_parser(
        "reindex",
        parents=[world, index],
        help="a copy of the world with its index rebuilt, beside it, for a running service to "
        "reload",
    )
    reindex.add_argument("--out", type=Path, required=True, help="the new world directory")
    reindex.set_defaults(run=_reindex)


def _add_import_catalog(
    commands: Commands,
    world: argparse.ArgumentParser,
    index: argparse.ArgumentParser,
) -> None:
    imported = commands.add_parser(
        "import-catalog", parents=[world, index], help="a real catalog from Parquet or NPZ"
    )
    imported.add_argument("--items", type=Path, required=True)
    imported.add_argument("--users", type=Path, required=True)
    imported.set_defaults(run=_import_catalog)


def _add_load_redis(commands: Commands, world: argparse.ArgumentParser) -> None:
    load = commands.add_parser("load-redis", parents=[world], help="write blobs into Redis")
    load.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    load.add_argument("--prefix", default="recsys")
    load.add_argument(
        "--cluster", action="store_true", help="--redis-url names one node of a Redis Cluster"
    )
    load.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help="threads writing at once (default %(default)s); a load stopped part-way resumes "
        "where it stopped when run again on the same world",
    )
    load.set_defaults(run=_load_redis)


def _add_build_world(
    commands: Commands,
    index: argparse.ArgumentParser,
) -> None:
    built = commands.add_parser(
        "build-world",
        parents=[index],
        help="a world from an interaction log: embeddings, features, ranker, evaluation",
        description="Learns embeddings and dense features from the interactions, trains the "
        "ranker, evaluates on each user's latest 20% and writes DIR/report.json.",
    )
    built.add_argument("--world", type=Path, required=True, help="the world directory to write")
    built.add_argument("--schema", type=Path, default=None, help="default: the interactions one")
    built.add_argument(
        "--interactions",
        type=str,
        required=True,
        help="the log: CSV, TSV or Parquet, gzipped or not (any name with --interactions-format)",
    )
    add_log_flags(built)
    add_item_table_flags(built)
    built.add_argument(
        "--item-features",
        choices=ITEM_FEATURES,
        default="auto",
        help="whether the item table's categories and publish dates feed the features: auto "
        "(the default) evaluates the world without them too and keeps them unless they "
        "lower the ranked list's NDCG@10; titles are kept either way",
    )
    built.add_argument(
        "--compare-inputs",
        action="store_true",
        help="also evaluate without each derived feature group (user dense, item dense, "
        "sequence), one more training apiece, to see what each buys (report.json inputs)",
    )
    built.add_argument(
        "--keep-holdout",
        action="store_true",
        help="serve the world trained without each user's latest 20%% (as evaluated)",
    )
    _add_learning_flags(built)
    built.add_argument("--seed", type=int, default=7)
    add_engine_flags(built)
    built.set_defaults(run=_build_world)


def _add_learning_flags(built: argparse.ArgumentParser) -> None:
    """The models build-world learns: the ranker's network, ALS's regularisation, the
    neighbours'."""
    built.add_argument(
        "--network",
        choices=sorted(NETWORKS),
        default="auto",
        help="the ranker: cross layers and a deep tower (dcn), the tower alone (mlp), or "
        "both trained and the one whose score ranks users it did not learn from better "
        "kept (auto, the default)",
    )
    built.add_argument(
        "--als-regularization",
        type=float,
        default=None,
        help="ALS's regularisation; default: each of a grid tried on the log's own split in "
        "time, the one whose factors recall best what users went on to like kept",
    )
    built.add_argument(
        "--neighbours",
        choices=("cosine", "ease"),
        default="cosine",
        help="how the item-to-item neighbours are scored: cosine over co-occurrence, or "
        "EASE's item weights (over the items most users chose, --ease-max-items of them at "
        "most: it inverts their square; the rest have no neighbours). An EASE world keeps "
        "cosine's too, for its item pages",
    )
    built.add_argument(
        "--order-model",
        action="store_true",
        help="also learn the order model, a GRU over each user's latest positives in time "
        "order, and serve its score as a sequence signal (local engine, a log with times; "
        "torch, in the tools' dependencies; learnt three times a build, about a minute each "
        "at 100,000 ratings)",
    )
    built.add_argument(
        "--ease-lambda",
        type=positive_float,
        default=None,
        help=f"EASE's regularisation, with --neighbours ease (default {EASE_LAMBDA:g}; "
        f"from {EASE_LAMBDAS[0]:g} to {EASE_LAMBDAS[1]:g})",
    )
    built.add_argument(
        "--ease-max-items",
        type=int,
        default=None,
        help=f"the most items EASE fits, with --neighbours ease (default {EASE_MAX_ITEMS:,}; "
        f"from {EASE_ITEM_RANGE[0]:,} to {EASE_ITEM_RANGE[1]:,}): it inverts in place, "
        f"{EASE_BYTES} bytes an item squared (0.8 GB at 10,000), and its arithmetic grows as "
        "the cube",
    )
