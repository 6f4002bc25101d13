"""build-world --engine spark against the local engine, on local[2] and on a standalone cluster
(a master and two workers started here by Spark's own launch classes, stopped by pid), and
the Spark-built world served by a real Redis and a real Triton.

Parity: the same log gives the same items, users, seen lists, positives, dense features and
neighbours, to the bit; the factors solve the same objective from the same start (the local solver
takes conjugate-gradient steps, the Spark one solves exactly), so they point the same way
and rank as well.

The local[2] build gathers a sample of the users on its driver (--spark-sample-rows below the
log's rows), as every production-size log does: the ranker and the blend learn on the sample,
featured from the whole log; the cluster build gathers every user.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recsys_tools.cli import main
from recsys_tools.localstack.spark_cluster import start_spark_cluster
from recsys_tools.world.judge.answers import AskContext, WorldAnswers
from recsys_tools.world.judge.holdout import split_holdout
from recsys_tools.world.learn.derive import item_dense, user_dense
from recsys_tools.world.learn.neighbours import EASE_LAMBDA, NeighbourModel, positive_neighbours
from recsys_tools.world.read.items import ItemColumns, read_items
from recsys_tools.world.read.log import LogColumns, read_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.world.layout import (
    FOLDIN_FILE,
    HOLDOUT_FILE,
    ITEMS_FILE,
    NEIGHBOURS_FILE,
    PAGE_NEIGHBOURS_FILE,
    POSITIVES_FILE,
    PRERANK_FILE,
    REPORT_FILE,
    SEEN_FILE,
    SERVED_FILES,
    USERS_FILE,
)
from app.world.prerank import load_prerank
from app.world.schema import world_schema
from app.world.stamp import read_stamp, verify_files
from tests.integration.conftest import CONTEXT, PLAIN_RULES, in_process_settings, serving
from tests.integration.movie_log import (
    MIN_RATING,
    build_movie_world,
    movie_world_args,
    served_world,
    write_movie_log,
)
from tests.recsys_cli import RECSYS

JAVA = bool(shutil.which("java") or os.environ.get("JAVA_HOME"))
# Skipped only when asked (the run's summary counts them either way): a machine without Java
# fails here instead of passing without the Spark engine.
SKIPPED = os.environ.get("RECSYS_SKIP_SPARK") == "1"
if not JAVA and not SKIPPED:
    raise RuntimeError(
        "no Java runtime for the Spark engine's tests: make setup installs Debian's OpenJDK "
        "as root; or set RECSYS_SKIP_SPARK=1 to run without them"
    )
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(SKIPPED, reason="RECSYS_SKIP_SPARK=1"),
]
# Few shuffle partitions: the test's log is small, and each partition costs a task.
SMALL = ("--spark-conf", "spark.sql.shuffle.partitions=2")
# A third of the log's 3,000 rows: the driver gathers about 40 of its 120 users.
SAMPLE_ROWS = 1000
# What both engines must write alike, field by field (the factors are left out: another ALS).
EXACT = {
    ITEMS_FILE: ("ids", "dense", "categories", "published_at", "popularity"),
    USERS_FILE: ("ids", "dense"),
    SEEN_FILE: ("user_ids", "offsets", "item_ids"),
    POSITIVES_FILE: ("user_ids", "offsets", "item_ids"),
    FOLDIN_FILE: ("idf", "max_user_positives", "k1", "b"),
    NEIGHBOURS_FILE: ("positions", "similarity"),
}


@dataclass(frozen=True)
class Built:
    folder: Path
    ratings: Path
    movies: Path
    rated: dict[str, set[str]]
    local: Path
    spark: Path


def _build(ratings: Path, movies: Path, world: Path, *extra: str) -> str:
    if "spark" in extra:
        done = _recsys(movie_world_args(ratings, movies, world, *extra))
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        build_movie_world(ratings, movies, world, *extra)
    return printed.getvalue()


def _recsys(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The tools' command line in a process of its own, as an operator runs it. pyspark
    starts its JVM by fork with a preexec_fn, and this test process holds gRPC's threads
    from the tests before it: one such fork left a child that died before exec (loaded run
    47: JAVA_GATEWAY_EXITED). A fresh process has no other threads to fork among."""
    return subprocess.run([*RECSYS, *argv], capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    folder = tmp_path_factory.mktemp("spark")
    ratings, movies, rated = write_movie_log(folder)
    local, spark = folder / "local", folder / "spark"
    _build(ratings, movies, local)
    _build(
        ratings,
        movies,
        spark,
        *("--engine", "spark", "--spark-master", "local[2]", *SMALL),
        *("--spark-sample-rows", str(SAMPLE_ROWS)),
    )
    return Built(folder, ratings, movies, rated, local, spark)


def _same_tables(first: Path, second: Path, without: str = "") -> None:
    for name, fields in EXACT.items():
        if name == without:
            continue
        with np.load(first / name) as one, np.load(second / name) as other:
            for field in fields:
                assert one[field].dtype == other[field].dtype, (name, field)
                assert np.array_equal(one[field], other[field]), (name, field)


def _report(world: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((world / REPORT_FILE).read_text())
    return report


def test_both_engines_write_the_same_tables(built: Built) -> None:
    _same_tables(built.local, built.spark)
    with np.load(built.spark / SEEN_FILE) as seen, np.load(built.spark / USERS_FILE) as users:
        assert len(seen["user_ids"]) == 120
        assert len(users["ids"]) == 120
        assert seen["offsets"][-1] == len(seen["item_ids"]) == 3000


def test_the_spark_world_is_stamped_as_the_local_one(built: Built) -> None:
    local, spark = read_stamp(built.local), read_stamp(built.spark)
    assert local is not None
    assert spark is not None
    assert set(spark.digests) == set(local.digests)
    verify_files(built.spark, spark, SERVED_FILES)  # raises on a file not the one stamped
    assert spark.world_id != local.world_id  # other factors: another world


def test_the_sampled_world_ranks_as_well(built: Built) -> None:
    local, spark = _report(built.local), _report(built.spark)
    for stage in ("recall", "rank"):
        mine = spark["evaluation"]["stages"][stage]["recall@10"]
        theirs = local["evaluation"]["stages"][stage]["recall@10"]
        # Generous: the sample's 40 users against all 120; the benchmark holds the engines
        # within 5% on real data.
        assert mine >= 0.75 * theirs, (stage, mine, theirs)
    # The same choices from a third of the users: on this log pre-rank weighs the user's
    # vector alone and the blend leaves the network out, whichever engine learns them. The
    # weights' scale follows each engine's factors; what pre-rank ranks by is their ratios.
    for world in (built.spark, built.local):
        assert (world / PRERANK_FILE).is_file(), world  # a world without reads as (1, 0, 0)
    ours, theirs = load_prerank(built.spark), load_prerank(built.local)
    assert ours.user > 0
    assert theirs.user > 0
    for signal in ("similar", "recent"):
        mine, other = getattr(ours, signal) / ours.user, getattr(theirs, signal) / theirs.user
        assert mine == pytest.approx(other, abs=0.25), signal
    assert spark["ranker"]["network_in_score"] == local["ranker"]["network_in_score"]


def test_the_sampled_ranker_is_featured_from_the_whole_log(built: Built) -> None:
    # The ranker's lists are drawn for the sampled users, but their features must be counted
    # over every user's early part, as the served world's are over every user's rows: each
    # row it was judged on (holdout.npz, with its user and item) holds that user's and that
    # item's dense features, computed here by the local engine's own functions. Featured
    # from the sample's own counts (the bug e3b7d05 fixed, which cost 0.81x ranked recall at
    # 25M rows), no row matches.
    items = read_items(built.movies, ItemColumns(item_id="movieId", category="genres"))
    columns = LogColumns(user="userId", item="movieId", weight="rating", min_weight=MIN_RATING)
    whole = read_log(built.ratings, columns, items)
    early = whole.subset(
        split_holdout(whole, WorldRecipe(built.ratings).holdout_share, seed=0).train
    )
    schema = world_schema(built.spark, None)
    with np.load(built.spark / HOLDOUT_FILE) as held:
        rows, users, listed = held["rows"], held["users"], held["items"]
    assert len(rows) > 0
    user_at = {user: k for k, user in enumerate(whole.user_ids.tolist())}
    item_at = {item: k for k, item in enumerate(whole.items.ids.tolist())}
    # Only sampled users have lists, and only a blending half of them (those with targets).
    assert len(set(users.tolist())) <= _report(built.spark)["engine"]["sampled_users"]
    for block, table, at in (
        ("item_dense", item_dense(early, schema), [item_at[item] for item in listed.tolist()]),
        ("user_dense", user_dense(early, schema), [user_at[user] for user in users.tolist()]),
    ):
        given, expected = rows[:, schema.blocks[block]], table[np.asarray(at)]
        matching = np.all(given == expected, axis=1)
        assert matching.all(), (block, f"{int(matching.sum())} of {len(rows)} rows")


def test_the_report_says_which_engine_built_it(built: Built) -> None:
    spark = _report(built.spark)
    assert spark["engine"]["name"] == "spark"
    assert spark["engine"]["master"] == "local[2]"
    assert spark["engine"]["sample_rows"] == SAMPLE_ROWS
    sampled = spark["engine"]["sampled_users"]
    assert 20 <= sampled <= 60, sampled  # about a third of 120, by a hash of each user
    assert spark["engine"]["sampled_rows"] == 25 * sampled  # every row of each: 25 a user
    assert _report(built.local)["engine"] == {"name": "local"}
    assert spark["counts"] == _report(built.local)["counts"]


def test_a_standalone_cluster_builds_the_same_tables(built: Built, tmp_path: Path) -> None:
    # With EASE's neighbours over the 150 items most users chose (of about 240): the cluster
    # sums the pairs' counts of those, the driver inverts.
    processes, url = start_spark_cluster(tmp_path / "cluster", workers=2)
    try:
        _build(
            built.ratings,
            built.movies,
            tmp_path / "world",
            "--engine",
            "spark",
            "--spark-master",
            url,
            "--neighbours",
            "ease",
            "--ease-max-items",
            "150",
            *SMALL,
        )
        workers = [(tmp_path / "cluster" / f"worker-{n}.log").read_text() for n in range(2)]
    finally:
        for process in reversed(processes):
            process.stop()
    assert not any(process.running() for process in processes)
    # Each worker ran executors of the build: the jobs crossed processes.
    assert all("Asked to launch executor" in log for log in workers)
    world = tmp_path / "world"
    _same_tables(built.local, world, without=NEIGHBOURS_FILE)
    engine = _report(world)["engine"]
    assert engine["master"] == url
    said = _report(world)["neighbours"]
    assert said == {
        "model": "ease",
        "lambda": EASE_LAMBDA,
        "max_items": 150,
        "items_with_neighbours": said["items_with_neighbours"],
        "page": "cosine",
    }
    assert 100 < said["items_with_neighbours"] <= 150
    # Its item pages read cosine's lists, which the local cosine build wrote, to the bit.
    with (
        np.load(world / PAGE_NEIGHBOURS_FILE) as page,
        np.load(built.local / NEIGHBOURS_FILE) as cosine,
    ):
        assert np.array_equal(page["positions"], cosine["positions"])
        assert np.array_equal(page["similarity"], cosine["similarity"])
    # The local engine's EASE over the whole log (the served world's part), to the bit.
    items = read_items(built.movies, ItemColumns(item_id="movieId", category="genres"))
    columns = LogColumns(user="userId", item="movieId", weight="rating", min_weight=MIN_RATING)
    model = NeighbourModel("ease", max_items=150)
    expected = positive_neighbours(read_log(built.ratings, columns, items), model)
    with np.load(world / NEIGHBOURS_FILE) as written:
        assert np.array_equal(written["positions"], expected.positions)
        assert np.array_equal(written["similarity"], expected.similarity)
        assert (written["positions"][:, 0] >= 0).sum() == said["items_with_neighbours"]
    assert engine["sampled_users"] == 120  # a log smaller than the sample: all of it
    # Every user gathered, so the regularisation is chosen on what the local engine chose it
    # on: one objective from one seeded start, the factors point the same way, item by item.
    with np.load(world / ITEMS_FILE) as mine, np.load(built.local / ITEMS_FILE) as theirs:
        first, second = mine["embeddings"], theirs["embeddings"]
    lengths = np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1)
    learnt = lengths > 0
    assert learnt.sum() > 0
    cosines = np.sum(first * second, axis=1)[learnt] / lengths[learnt]
    assert np.median(cosines) > 0.95, np.median(cosines)


def test_an_unreadable_time_fails_with_the_flag_that_fixes_it(built: Built, tmp_path: Path) -> None:
    log = tmp_path / "ratings.csv"
    log.write_text("userId,movieId,rating,timestamp\n1,10,4.0,yesterday\n2,10,4.0,1500000000\n")
    done = _recsys(
        [
            "build-world",
            "--interactions",
            str(log),
            "--user-col",
            "userId",
            "--item-col",
            "movieId",
            "--world",
            str(tmp_path / "world"),
            "--engine",
            "spark",
            *SMALL,
        ]
    )
    assert done.returncode != 0
    # The executor's error, as one line of the build's log: no Java or Python stack in it
    # (Spark's own log, on the same stderr, may hold the task's).
    said = [line for line in done.stderr.splitlines() if "] recsys " in line]
    assert said, done.stderr[-2000:]
    assert "'yesterday'" in said[-1]
    assert "--time-format" in said[-1]


def test_an_infinite_weight_is_refused_as_the_local_engine_refuses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "ratings.csv"
    log.write_text("userId,movieId,rating,timestamp\n1,10,inf,1500000000\n2,10,4.0,1500000000\n")
    argv = [
        "build-world",
        *("--interactions", str(log), "--user-col", "userId", "--item-col", "movieId"),
        *("--weight-col", "rating", "--world", str(tmp_path / "world")),
    ]
    caplog.clear()
    assert main([*argv, "--engine", "local"]) == 2
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("'rating' is infinite in 1 of its rows" in m for m in said), said
    done = _recsys([*argv, "--engine", "spark", *SMALL])
    assert done.returncode == 2
    assert "'rating' is infinite in 1 of its rows" in done.stderr, done.stderr[-2000:]


@pytest.fixture(scope="module")
def served(built: Built) -> Iterator[dict[str, Any]]:
    folder = built.folder / "serving"
    rules = built.folder / "rules.toml"
    rules.write_text(PLAIN_RULES)
    with served_world(built.spark, folder) as stack:
        yield {
            "artifacts_dir": built.spark,
            "redis_url": stack.redis_url,
            "triton_url": stack.triton_url,
            "rules_file": rules,
        }


async def test_the_sampled_world_serves_what_its_files_say(
    built: Built, served: dict[str, Any]
) -> None:
    # Every user's answer is the list computed offline from the world's own files (the
    # service's candidate stages, the model through onnxruntime), as the local engine's is.
    users = sorted(built.rated, key=int)
    expected = dict(WorldAnswers(built.spark).answers(users, AskContext(**CONTEXT)))
    async with serving(in_process_settings(**served)) as api:
        for user in users:
            response = await api.post(
                "/recommend", json={"user_id": user, "num_items": 10, "context": CONTEXT}
            )
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["degraded"] == []
            assert answer["cold_start"] is False
            items = [item["item_id"] for item in answer["items"]]
            assert items == expected[user], user
            assert len(items) == 10
            assert not set(items) & built.rated[user]
