"""A ratings log laid out as public rating sets are, written here, its world built, and that
world served by a real Redis and a real Triton."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from recsys_tools.cli import main
from recsys_tools.demo import StackOptions, prepare_model_repository
from recsys_tools.localstack import (
    ManagedProcess,
    default_triton_env,
    project_root,
    start_redis,
    start_triton,
)

from app.world.schema import world_schema

START = 1_500_000_000
GENRES = ["Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi", "Thriller", "War"]
MIN_RATING = 3.5


def write_movie_log(folder: Path) -> tuple[Path, Path, dict[str, set[str]]]:
    """Users who love two genres, rate them high and the rest low; ids are sparse integers."""
    rng = np.random.default_rng(4)
    movie_ids = rng.choice(np.arange(1, 5000), size=240, replace=False)
    genres = rng.integers(0, len(GENRES), size=len(movie_ids))
    with (folder / "movies.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["movieId", "title", "genres"])
        for movie, genre in zip(movie_ids.tolist(), genres.tolist(), strict=True):
            second = GENRES[(genre + 1) % len(GENRES)]
            writer.writerow([movie, f"Movie {movie}", f"{GENRES[genre]}|{second}"])
    rated: dict[str, set[str]] = {}
    with (folder / "ratings.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["userId", "movieId", "rating", "timestamp"])
        for user in range(1, 121):
            loved = rng.choice(len(GENRES), size=2, replace=False)
            liked = np.isin(genres, loved)
            weights = np.where(liked, 6.0, 1.0)
            picks = rng.choice(len(movie_ids), size=25, replace=False, p=weights / weights.sum())
            for day, pick in enumerate(picks.tolist()):
                rating = rng.choice([4.0, 4.5, 5.0]) if liked[pick] else rng.choice([1.0, 2.0, 3.0])
                moment = START + (day * 120 + user) * 3600
                writer.writerow([user, int(movie_ids[pick]), rating, moment])
                rated.setdefault(str(user), set()).add(str(movie_ids[pick]))
    return folder / "ratings.csv", folder / "movies.csv", rated


def movie_world_args(ratings: Path, movies: Path, world: Path, *extra: str) -> list[str]:
    """build-world's arguments for the log write_movie_log wrote."""
    return [
        "build-world",
        "--interactions",
        str(ratings),
        "--user-col",
        "userId",
        "--item-col",
        "movieId",
        "--weight-col",
        "rating",
        "--min-weight",
        str(MIN_RATING),
        "--items",
        str(movies),
        "--item-id-col",
        "movieId",
        "--category-col",
        "genres",
        "--world",
        str(world),
        *extra,
    ]


def build_movie_world(ratings: Path, movies: Path, world: Path, *extra: str) -> None:
    assert main(movie_world_args(ratings, movies, world, *extra)) == 0


@dataclass(frozen=True)
class Stack:
    redis_url: str
    triton_url: str
    repository: Path  # the model repository Triton serves, with the world's model


@contextmanager
def served_world(world: Path, folder: Path) -> Iterator[Stack]:
    """A Redis loaded with `world` by load-redis and a Triton serving its model, stopped by
    pid on the way out."""
    options = StackOptions(world, project_root() / "model_repository", folder / "run")
    repository = prepare_model_repository(options, world_schema(world, None).model_name)
    started: list[ManagedProcess] = []
    try:
        redis_process, redis_url = start_redis(folder / "redis")
        started.append(redis_process)
        assert main(["load-redis", "--world", str(world), "--redis-url", redis_url]) == 0
        triton, triton_url = start_triton(
            default_triton_env(),
            repository,
            folder / "triton",
            ["ranking_model"],
            model_control=True,
        )
        started.append(triton)
        yield Stack(redis_url, triton_url, repository)
    finally:
        for process in reversed(started):
            process.stop()
