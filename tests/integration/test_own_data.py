"""Your own data, end to end: a ratings file in a public layout, built, loaded, served.

A log written here the way public rating sets are laid out (integer ids, `userId,movieId,
rating,timestamp`, genres `A|B`) goes through `recsys build-world` and `recsys load-redis`,
and is served by a real Redis and a real Triton that run the world's own model.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton_grpc
from recsys_tools.cli import main

from app.core.settings import Settings
from app.world.layout import REPORT_FILE
from app.world.stamp import read_stamp
from tests.integration.conftest import in_process_settings, serving
from tests.integration.movie_log import build_movie_world, served_world, write_movie_log

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Movies:
    folder: Path
    world: Path
    rated: dict[str, set[str]]
    movie_ids: set[str]
    redis_url: str
    triton_url: str
    repository: Path
    printed: str

    def settings(self, **overrides: Any) -> Settings:
        here = {"redis_url": self.redis_url, "triton_url": self.triton_url}
        return in_process_settings(**{"artifacts_dir": self.world, **here, **overrides})


@pytest.fixture(scope="module")
def movies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Movies]:
    folder = tmp_path_factory.mktemp("movies")
    ratings, table, rated = write_movie_log(folder)
    world = folder / "world"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        build_movie_world(ratings, table, world)
    with served_world(world, folder) as stack:
        ids = {row["movieId"] for row in csv.DictReader(table.open())}
        yield Movies(
            folder,
            world,
            rated,
            ids,
            stack.redis_url,
            stack.triton_url,
            stack.repository,
            printed.getvalue(),
        )


async def test_answers_hold_unseen_catalog_ids_as_given(movies: Movies) -> None:
    async with serving(movies.settings()) as api:
        for user in ("1", "17", "60", "118"):
            response = await api.post(
                "/recommend", json={"user_id": user, "num_items": 10, "debug": True}
            )
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["degraded"] == []
            assert answer["cold_start"] is False
            items = [item["item_id"] for item in answer["items"]]
            assert len(items) == 10
            assert set(items) <= movies.movie_ids  # "17", never "17.0" or "i17"
            assert not set(items) & movies.rated[user]
            assert all(item["score"] is not None for item in answer["items"])


def test_the_report_has_the_evaluation_and_it_is_printed(movies: Movies) -> None:
    report = json.loads((movies.world / REPORT_FILE).read_text())
    evaluation = report["evaluation"]
    methods, stages = evaluation["methods"], evaluation["stages"]
    assert set(methods) == {"recall", "prerank", "recall_rank", "popularity", "item_knn"}
    assert list(stages) == ["recall", "prerank", "rank"]
    assert evaluation["users_evaluated"] == 120
    # Tastes are planted: what the model learnt beats handing everyone the popular items.
    assert methods["recall_rank"]["ndcg@10"] > methods["popularity"]["ndcg@10"]
    # Each stage hands on part of what came in: the share held out can only fall.
    shares = [figures["pool_share"] for figures in stages.values()]
    assert shares == sorted(shares, reverse=True), stages
    for name in ("item_knn", "popularity", *stages):
        figures = methods[name] if name in methods else stages[name]
        assert f"{figures['recall@10']:.4f}" in movies.printed
        assert name in movies.printed
    stamp = read_stamp(movies.world)
    assert stamp is not None
    assert report["histories"]["longest"] > 0


async def test_readiness_fails_when_triton_loads_another_worlds_model(movies: Movies) -> None:
    other = movies.folder / "other-world"
    build_movie_world(
        movies.folder / "ratings.csv", movies.folder / "movies.csv", other, "--seed", "9"
    )
    async with serving(movies.settings()) as api:
        assert (await api.get("/readyz")).json()["checks"]["model_world"] is True
        main(["install-model", "--world", str(other), "--model-repository", str(movies.repository)])
        client = triton_grpc.InferenceServerClient(movies.triton_url)
        try:
            client.load_model("ranking_model")  # Triton reads the config anew
            ready = await api.get("/readyz")
        finally:
            main(
                [
                    "install-model",
                    "--world",
                    str(movies.world),
                    "--model-repository",
                    str(movies.repository),
                ]
            )
            client.load_model("ranking_model")
            client.close()
    assert ready.status_code == 503
    assert ready.json()["failing"] == ["model_world"]
