"""build-world's data side: an interaction log in, a trained, evaluated world directory out."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recsys_tools.cli import main
from recsys_tools.world.commands import evaluation_table
from recsys_tools.world.judge.holdout import split_holdout
from recsys_tools.world.learn.derive import (
    ITEM_FEATURES,
    USER_FEATURES,
    category_codes,
    interactions_schema_path,
    item_dense,
    item_tallies,
    published_from,
    totals,
    user_dense,
)
from recsys_tools.world.learn.factorize import REGULARIZATION
from recsys_tools.world.learn.neighbours import NeighbourModel
from recsys_tools.world.read.items import ItemColumns, read_items
from recsys_tools.world.read.log import LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.core.errors import ConfigError
from app.release.catalog import load_catalog
from app.world.layout import (
    MANIFEST_FILE,
    MODEL_FILE,
    NEIGHBOURS_FILE,
    PAGE_NEIGHBOURS_FILE,
    REPORT_FILE,
)
from app.world.schema import FeatureSchema, load_schema
from app.world.stamp import read_stamp, verify_files
from app.world.tables import load_items, load_seen, load_users

START = 1_600_000_000
DAY = 86_400
PUBLIC = LogColumns(user="userId", item="movieId", time="timestamp", weight="rating")
MOVIES = ItemColumns(item_id="movieId", category="genres")
Row = tuple[int, int, float, int]


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return load_schema(interactions_schema_path())


def _write_csv(path: Path, header: list[str], rows: list[Any]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _public_rows() -> list[Row]:
    """30 users rating items 1..40 (and 999, which the item table lacks), one a day."""
    rng = np.random.default_rng(1)
    rows: list[Row] = []
    for user in range(1, 31):
        items = rng.choice(np.arange(1, 41), size=8 + user % 5, replace=False)
        for day, item in enumerate(items.tolist()):
            rating = float(rng.choice([1.0, 2.5, 3.5, 4.0, 5.0]))
            rows.append((user, item, rating, START + (day * 31 + user) * DAY))
    rows += [(3, 999, 5.0, START), (4, 999, 4.0, START)]
    # User 31 rates only low: read, but with no positive at min_weight 3, so not served.
    rows += [(31, 1, 1.0, START), (31, 2, 2.0, START + DAY)]
    return rows


@dataclass(frozen=True)
class Public:
    folder: Path
    rows: list[Row]
    recipe: WorldRecipe


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Public:
    folder = tmp_path_factory.mktemp("public")
    rows = _public_rows()
    ratings = _write_csv(folder / "ratings.csv", ["userId", "movieId", "rating", "timestamp"], rows)
    # Item 41 has no interactions and stays; 17 is in two genres, 'Comedy' listed first.
    movies = [(i, f"Movie {i}, the sequel", "Action" if i % 2 else "Drama") for i in range(1, 42)]
    movies[16] = (17, "Movie 17", "Comedy|Action")
    items = _write_csv(folder / "movies.csv", ["movieId", "title", "genres"], movies)
    recipe = WorldRecipe(
        interactions=ratings,
        columns=LogColumns("userId", "movieId", "timestamp", "rating", min_weight=3.0),
        items=items,
        item_columns=MOVIES,
    )
    return Public(folder, rows, recipe)


@pytest.fixture(scope="module")
def built(public: Public, schema: FeatureSchema) -> dict[str, Any]:
    return build_world_from_log(public.recipe, public.folder / "world", schema)


def test_the_world_has_every_file_and_loads_as_the_service_loads_it(
    public: Public, built: dict[str, Any], schema: FeatureSchema
) -> None:
    world = public.folder / "world"
    for name in ("items.npz", "users.npz", "index.faiss", "default_user.npy", "seen.npz"):
        assert (world / name).is_file(), name
    catalog = load_catalog(world, schema, nprobe=8)
    assert catalog.size == 41  # the table's items: 999 dropped, 41 kept without interactions
    session = ort.InferenceSession((world / MODEL_FILE).read_bytes())
    rows = np.zeros((3, schema.width), dtype=np.float32)
    (scores,) = session.run([schema.output_name], {schema.input_name: rows})
    assert scores.shape == (3, 1)
    manifest = json.loads((world / MANIFEST_FILE).read_text())
    # Written once, at the stamp: what the catalog, the item prior and the build each say.
    assert manifest["source"] == "interactions"
    assert manifest["items"] == manifest["index_ntotal"] == 41
    assert manifest["embedding_dim"] == schema.embedding_dim
    assert manifest["item_prior"]
    assert manifest["build_seconds"] > 0
    assert manifest["counts"] == built["counts"]
    assert manifest["files"]
    assert manifest["world_id"]


def test_ids_stay_as_written_and_categories_take_the_first_listed(
    public: Public, built: dict[str, Any]
) -> None:
    world = public.folder / "world"
    items, users = load_items(world), load_users(world)
    assert "17" in items.ids.tolist()
    assert not any("." in item_id for item_id in items.ids.tolist())
    assert sorted(users.ids.tolist(), key=int) == [str(u) for u in range(1, 31)]  # not 31
    seventeen = items.ids.tolist().index("17")
    comedy = sorted({"Action", "Drama", "Comedy"}).index("Comedy")
    assert items.categories[seventeen] == comedy
    assert items.popularity[items.ids.tolist().index("41")] == 0
    assert not items.embeddings[items.ids.tolist().index("41")].any()


def test_seen_lists_hold_every_rated_item_newest_first(
    public: Public, built: dict[str, Any]
) -> None:
    seen = load_seen(public.folder / "world")
    assert seen is not None
    for user in ("1", "7", "30"):
        position = seen.user_ids.tolist().index(user)
        listed = seen.item_ids[seen.offsets[position] : seen.offsets[position + 1]].tolist()
        mine = [r for r in public.rows if r[0] == int(user) and r[1] != 999]
        expected = [str(r[1]) for r in sorted(mine, key=lambda r: r[3], reverse=True)]
        assert listed == expected


def test_the_report_has_the_figures(public: Public, built: dict[str, Any]) -> None:
    report = json.loads((public.folder / "world" / REPORT_FILE).read_text())
    assert report == json.loads(json.dumps(built))
    counts = report["counts"]
    assert counts["rows_read"] == len(public.rows)
    assert counts["dropped"]["item_not_in_table"] == 2
    assert counts["below_min_weight"] == sum(1 for r in public.rows if r[2] < 3 and r[1] != 999)
    assert counts["users"] == 30
    assert counts["items_without_interactions"] == 1
    evaluation = report["evaluation"]
    assert evaluation["users_evaluated"] > 0
    assert evaluation["holdout_share"] == 0.2
    for method in ("recall", "recall_rank", "popularity"):
        figures = evaluation["methods"][method]
        assert 0 <= figures["recall@10"] <= 1
        assert 0 <= figures["ndcg@10"] <= 1
    per_user = np.bincount([r[0] for r in public.rows if r[1] != 999])
    assert report["histories"] == {"users": int((per_user > 0).sum()), "longest": per_user.max()}
    assert {"read", "evaluate", "write", "total"} <= set(report["seconds"])
    with np.load(public.folder / "world" / NEIGHBOURS_FILE) as written:
        listed = int((written["positions"][:, 0] >= 0).sum())
    assert report["neighbours"] == {"model": "cosine", "items_with_neighbours": listed}
    assert listed > 0
    assert not (public.folder / "world" / PAGE_NEIGHBOURS_FILE).exists()


def _lists(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as written:
        return written["positions"], written["similarity"]


def test_an_ease_world_keeps_cosines_lists_for_its_pages_and_a_cosine_rebuild_drops_them(
    public: Public, built: dict[str, Any], schema: FeatureSchema, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    ease = NeighbourModel("ease", lam=5.0)
    report = build_world_from_log(replace(public.recipe, neighbours=ease), world, schema)
    cosine = _lists(public.folder / "world" / NEIGHBOURS_FILE)
    page = _lists(world / PAGE_NEIGHBOURS_FILE)
    # The page's lists are the cosine world's, to the bit; the feed's are EASE's own.
    assert all(np.array_equal(mine, theirs) for mine, theirs in zip(page, cosine, strict=True))
    feed = _lists(world / NEIGHBOURS_FILE)
    assert not np.array_equal(feed[0], cosine[0])
    assert report["neighbours"]["model"] == "ease"
    assert report["neighbours"]["page"] == "cosine"
    # Stamped like every served file: one changed after the build is refused at start.
    manifest = json.loads((world / MANIFEST_FILE).read_text())
    assert PAGE_NEIGHBOURS_FILE in manifest["files"]
    stamp = read_stamp(world)
    assert stamp is not None
    verify_files(world, stamp)
    catalog = load_catalog(world, schema, nprobe=8)
    assert catalog.neighbours is not None
    assert catalog.neighbours_for_pages is not None
    assert np.array_equal(catalog.neighbours_for_pages.positions, cosine[0])
    assert np.array_equal(catalog.neighbours.positions, feed[0])
    original = (world / PAGE_NEIGHBOURS_FILE).read_bytes()
    np.savez(world / PAGE_NEIGHBOURS_FILE, positions=cosine[0][::-1], similarity=cosine[1])
    with pytest.raises(ConfigError, match=r"page_neighbours\.npz does not belong to world"):
        verify_files(world, stamp)
    (world / PAGE_NEIGHBOURS_FILE).write_bytes(original)
    # A cosine build in the same directory leaves no page list of the EASE one behind.
    build_world_from_log(public.recipe, world, schema)
    assert not (world / PAGE_NEIGHBOURS_FILE).exists()
    assert load_catalog(world, schema, nprobe=8).page_neighbours is None


def _planted_log(folder: Path) -> Path:
    """Five user clusters that each like one item cluster, plus a global popularity skew."""
    rng = np.random.default_rng(0)
    n_users, n_items, clusters = 150, 250, 5
    item_cluster = np.arange(n_items) % clusters
    skew = rng.permutation(1.0 / np.arange(1, n_items + 1))
    skew /= skew.sum()
    rows: list[Row] = []
    for user in range(n_users):
        mine = np.flatnonzero(item_cluster == user % clusters)
        taste = 1.0 / np.arange(1, len(mine) + 1) ** 0.7
        chosen: set[int] = set()
        for t in np.sort(rng.integers(START, START + 90 * DAY, size=rng.integers(25, 45))):
            for _ in range(20):  # a user rates an item once
                liked = rng.random() < 0.75
                item = int(
                    rng.choice(mine, p=taste / taste.sum())
                    if liked
                    else rng.choice(n_items, p=skew)
                )
                if item not in chosen:
                    break
            chosen.add(item)
            rows.append((user, item, 5.0, int(t)))
    return _write_csv(folder / "planted.csv", ["userId", "movieId", "rating", "timestamp"], rows)


def test_an_ease_world_served_from_its_train_part_keeps_that_parts_cosine_lists(
    public: Public, built: dict[str, Any], schema: FeatureSchema, tmp_path: Path
) -> None:
    held = replace(public.recipe, keep_holdout=True)
    build_world_from_log(held, tmp_path / "cosine", schema)
    ease = replace(held, neighbours=NeighbourModel("ease", lam=5.0))
    report = build_world_from_log(ease, tmp_path / "ease", schema)
    assert report["neighbours"]["page"] == "cosine"
    page = _lists(tmp_path / "ease" / PAGE_NEIGHBOURS_FILE)
    train = _lists(tmp_path / "cosine" / NEIGHBOURS_FILE)
    assert all(np.array_equal(mine, theirs) for mine, theirs in zip(page, train, strict=True))
    # The train part's lists, not the whole log's: the held-out rows taught the page nothing.
    whole = _lists(public.folder / "world" / NEIGHBOURS_FILE)
    assert page[1].shape == whole[1].shape
    assert not np.array_equal(page[1], whole[1])


def test_on_planted_structure_ranking_recalled_items_beats_popularity(
    tmp_path: Path, schema: FeatureSchema
) -> None:
    recipe = WorldRecipe(interactions=_planted_log(tmp_path), columns=PUBLIC, keep_holdout=True)
    report = build_world_from_log(recipe, tmp_path / "world", schema)
    methods = report["evaluation"]["methods"]
    assert report["evaluation"]["users_evaluated"] == 150
    for metric in ("recall@10", "ndcg@10"):
        assert methods["recall_rank"][metric] > methods["popularity"][metric], metric
        assert methods["recall"][metric] > methods["popularity"][metric], metric
    for name, figures in [*methods.items(), *report["evaluation"]["stages"].items()]:
        low, high = figures["recall@10_interval"]
        assert low <= figures["recall@10"] <= high, name
        assert low < high, name
    ranked = report["evaluation"]["stages"]["rank"]
    row = next(line for line in evaluation_table(report).splitlines() if line.startswith("rank"))
    assert f"{ranked['recall@10_interval'][0]:.4f}-{ranked['recall@10_interval'][1]:.4f}" in row
    assert "95% interval" in evaluation_table(report).splitlines()[0]


def test_evaluate_holds_the_files_answers_against_the_builds_claim_and_its_interval(
    tmp_path: Path, schema: FeatureSchema, capsys: pytest.CaptureFixture[str]
) -> None:
    log = ["--interactions", str(_planted_log(tmp_path))]
    public = ["--user-col", "userId", "--item-col", "movieId", "--weight-col", "rating"]
    assert main(["split-log", *log, "--out", str(tmp_path), *public]) == 0
    capsys.readouterr()
    # The parts are written in split-log's own column names. At the default regularisation:
    # its choice on the split is another test's, and costs fits.
    recipe = WorldRecipe(
        interactions=tmp_path / "earlier.csv",
        columns=LogColumns(weight="rating"),
        regularization=REGULARIZATION,
    )
    built = build_world_from_log(recipe, tmp_path / "world", schema)
    asked = [
        "evaluate",
        "--world",
        str(tmp_path / "world"),
        "--interactions",
        str(tmp_path / "later.csv"),
        "--earlier",
        str(tmp_path / "earlier.csv"),
        "--weight-col",
        "rating",
        "--min-weight",
        "4",
    ]
    assert main(asked) == 0
    report = json.loads(capsys.readouterr().out)
    ranked = built["evaluation"]["stages"]["rank"]
    assert report["build_claims"]["rank"] == ranked["recall@10"]
    assert report["build_claim_interval"] == ranked["recall@10_interval"]
    served = report["files"]["recall@10"]
    assert served > 0.0
    assert report["files"]["seen_items_served"] == 0
    assert report["served_over_build"] == round(served / ranked["recall@10"], 3)
    low, high = report["build_claim_interval"]
    assert report["served_inside_build_interval"] is (low <= served <= high)


def test_a_wrong_column_names_the_columns_and_the_flag(public: Public) -> None:
    with pytest.raises(ConfigError, match=r"no column 'user_id' \(it has userId, .*--user-col"):
        read_log(public.recipe.interactions, LogColumns())
    with pytest.raises(ConfigError, match=r"--min-weight needs a weight column.*--weight-col"):
        read_log(public.recipe.interactions, LogColumns("userId", "movieId", min_weight=3.0))
    with pytest.raises(ConfigError, match=r"no column 'genre'.*--category-col"):
        read_items(public.folder / "movies.csv", ItemColumns("movieId", category="genre"))


def test_files_that_cannot_be_read_say_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*--interactions"):
        read_log(tmp_path / "absent.csv", PUBLIC)
    (tmp_path / "log.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"\.csv, \.tsv or \.parquet"):
        read_log(tmp_path / "log.json", PUBLIC)
    bad = _write_csv(
        tmp_path / "bad.csv", ["userId", "movieId", "rating", "timestamp"], [(1, 2, 4, "soon")]
    )
    with pytest.raises(ConfigError, match=r"'soon' in column 'timestamp'.*--time-col") as caught:
        read_log(bad, PUBLIC)
    assert "\n" not in str(caught.value)


def test_min_weight_decides_the_positives(public: Public) -> None:
    everything = read_log(public.recipe.interactions, PUBLIC)
    assert everything.positive.all()
    rated = read_log(public.recipe.interactions, public.recipe.columns)
    assert int(rated.positive.sum()) == sum(1 for r in public.rows if r[2] >= 3.0)
    too_high = LogColumns("userId", "movieId", "timestamp", "rating", min_weight=6.0)
    with pytest.raises(ConfigError, match="lower --min-weight"):
        read_log(public.recipe.interactions, too_high)


def test_items_missing_from_the_item_table_are_dropped_and_counted(public: Public) -> None:
    items = read_items(public.folder / "movies.csv", MOVIES)
    log = read_log(public.recipe.interactions, PUBLIC, items)
    assert log.counts.dropped["item_not_in_table"] == 2
    assert len(log.user) == len(public.rows) - 2
    assert log.n_items == 41
    assert items.category_names == ("Action", "Comedy", "Drama")


def test_a_schema_naming_an_underivable_feature_is_refused(public: Public, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"price_affinity.*derivable: activity, tenure"):
        build_world_from_log(public.recipe, tmp_path / "world", load_schema())
    assert not (tmp_path / "world").exists()


def test_ids_and_times_from_parquet_and_iso_text(tmp_path: Path, schema: FeatureSchema) -> None:
    path = tmp_path / "log.parquet"
    table = pa.table(
        {
            "user_id": pa.array(["007", "007", "42"]),
            "item_id": pa.array([17, 18, 17], pa.int64()),
            "timestamp": [
                "2024-01-01T00:00:00Z",
                "2024-01-02 00:00:00",
                "2024-01-01T01:00:00+01:00",
            ],
        }
    )
    pq.write_table(table, path)
    log = read_log(path, LogColumns())
    assert log.user_ids.tolist() == ["007", "42"]
    assert log.items.ids.tolist() == ["17", "18"]
    assert log.time.tolist() == [1_704_067_200, 1_704_153_600, 1_704_067_200]


def test_derived_features_on_a_hand_made_log(tmp_path: Path, schema: FeatureSchema) -> None:
    ratings = _write_csv(
        tmp_path / "r.csv",
        ["userId", "movieId", "rating", "timestamp"],
        [(1, "a", 5, START), (1, "b", 1, START + 30 * DAY), (2, "a", 4, START + 60 * DAY)],
    )
    items = _write_csv(
        tmp_path / "i.csv", ["movieId", "genres"], [("a", "X|Y"), ("b", "Y"), ("c", "")]
    )
    columns = LogColumns("userId", "movieId", "timestamp", "rating", min_weight=3.0)
    log = read_log(ratings, columns, read_items(items, ItemColumns("movieId", category="genres")))
    items_features = dict(zip(schema.item_dense, item_dense(log, schema).T, strict=True))
    users_features = dict(zip(schema.user_dense, user_dense(log, schema).T, strict=True))
    np.testing.assert_allclose(items_features["log_popularity"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(items_features["category_share"], [1.0, 1.0, 0.0])
    np.testing.assert_allclose(items_features["freshness"][:2], [np.exp(-2), np.exp(-1)], rtol=1e-5)
    assert items_features["mean_weight"][0] > 0.5 > items_features["mean_weight"][1]
    np.testing.assert_allclose(users_features["tenure"], [0.5, 0.0])
    np.testing.assert_allclose(users_features["category_breadth"], [1.0, 1.0])
    np.testing.assert_allclose(users_features["recency"], [np.exp(-1), 1.0], rtol=1e-5)
    assert category_codes(log.items).tolist() == [0, 1, 2]  # X, Y, and none shares code 2


def test_the_holdout_is_the_latest_fifth_of_each_users_rows(public: Public) -> None:
    # Cut as split-log cuts a log: each user's first floor(0.8 n) rows (at least one) stay.
    log = read_log(public.recipe.interactions, PUBLIC)
    holdout = split_holdout(log, 0.2, seed=0)
    rows = np.bincount(log.user, minlength=log.n_users)
    held = np.bincount(log.user[~holdout.train], minlength=log.n_users)
    expected = rows - np.maximum(1, np.floor(rows * 0.8 + 1e-9))
    np.testing.assert_array_equal(held, expected)
    for user in range(log.n_users):
        mine = log.user == user
        if held[user]:
            assert log.time[mine & ~holdout.train].min() >= log.time[mine & holdout.train].max()


def test_the_packaged_schema_documents_what_the_registry_computes(schema: FeatureSchema) -> None:
    # The packaged schema's 121 columns, and the five sequence signals after them.
    assert schema.width == load_schema().width + 5 == 126
    assert schema.sequence == (
        "similar",
        "recent",
        "recent_max",
        "recent_mean",
        "recent_category",
    )
    for name in schema.user_dense:
        assert schema.docs[name].meaning == USER_FEATURES[name].meaning
    for name in schema.item_dense:
        assert schema.docs[name].scale == ITEM_FEATURES[name].scale


def test_publish_times_come_from_the_table_else_the_first_interaction(tmp_path: Path) -> None:
    log_file = tmp_path / "log.tsv"
    log_file.write_text("u\ti\tt\n1\ta\t100\n1\tb\t200\n2\tb\t300\n")
    table = _write_csv(tmp_path / "i.csv", ["item_id", "pub"], [("a", "2024-01-01"), ("b", "")])
    items = read_items(table, ItemColumns(published="pub"))
    log = read_log(log_file, LogColumns("u", "i", "t"), items)
    published = published_from(item_tallies(log), log.items, totals(log))
    assert published.tolist() == [1_704_067_200, 200]
