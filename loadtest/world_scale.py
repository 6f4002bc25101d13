"""How the world build scales with the log: both engines at 1M, 5M and 25M interactions.

The logs are generated at the shape of the largest public movie-ratings set (about 154
ratings per user, 400 per item, 20 genres, half-star ratings, users who favour two genres,
items of power-law popularity), written once as CSV under --out and reused. Each build runs
`recsys build-world` as a child process while a sampler reads the resident memory of its
whole process tree (the driver, Spark's JVM, its Python workers) every half second.

    python -m loadtest.world_scale --sizes 1000000,5000000 --engines local,spark
    python -m loadtest.world_scale --sizes 25000000 --engines spark --memory-limit-gb 4

With --memory-limit-gb the local engine also runs under that address-space limit (ulimit -v),
to show where it stops and what it says. `--neighbours ease` builds with EASE's neighbours
(its worlds and build logs named -ease; the generated ratings are shared). Figures go to
OUT/scale.json (scale-ease.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from app.world.layout import REPORT_FILE

PER_USER, PER_ITEM, GENRES = 154, 400, 20
START = 1_000_000_000
YEARS = 10 * 365 * 86_400
SAMPLE_S = 1.0


def write_log(folder: Path, rows: int, seed: int = 3) -> tuple[Path, Path]:
    """ratings.csv (userId,movieId,rating,timestamp) and movies.csv (movieId,title,genres)."""
    ratings, movies = folder / f"ratings-{rows}.csv", folder / f"movies-{rows}.csv"
    if ratings.is_file() and movies.is_file():
        return ratings, movies
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_users, n_items = max(rows // PER_USER, 10), max(rows // PER_ITEM, 20)
    genre = rng.integers(0, GENRES, n_items)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.9
    rng.shuffle(popularity)
    activity = rng.lognormal(0.0, 1.0, n_users) + 0.15
    per_user = np.maximum((activity / activity.sum() * rows).astype(np.int64), 1)
    user = np.repeat(np.arange(n_users), per_user)[:rows]
    loves = rng.integers(0, GENRES, (n_users, 2))
    liked_pick = rng.random(len(user)) < 0.7
    target = np.where(liked_pick, loves[user, rng.integers(0, 2, len(user))], -1)
    item = np.empty(len(user), dtype=np.int64)
    anywhere = np.cumsum(popularity) / popularity.sum()
    rest = target < 0
    item[rest] = np.searchsorted(anywhere, rng.random(int(rest.sum())))
    for g in range(GENRES):
        members = np.flatnonzero(genre == g)
        chosen = target == g
        cdf = np.cumsum(popularity[members]) / popularity[members].sum()
        item[chosen] = members[np.searchsorted(cdf, rng.random(int(chosen.sum())))]
    item = np.minimum(item, n_items - 1)
    liked = loves[user, 0] == genre[item]
    liked |= loves[user, 1] == genre[item]
    stars = np.where(liked, rng.integers(7, 11, len(user)), rng.integers(1, 8, len(user)))
    begins = rng.integers(0, YEARS, n_users)
    offset = np.arange(len(user)) - np.repeat(np.cumsum(per_user) - per_user, per_user)[:rows]
    times = START + begins[user] + offset * rng.integers(60, 86_400, len(user))
    table = pa.table(
        {
            "userId": user + 1,
            "movieId": item + 1,
            "rating": stars / 2.0,
            "timestamp": times,
        }
    )
    pacsv.write_csv(table, ratings)
    names = [f"genre{g}" for g in range(GENRES)]
    catalog = pa.table(
        {
            "movieId": np.arange(1, n_items + 1),
            "title": [f"Movie {i}" for i in range(1, n_items + 1)],
            "genres": [f"{names[g]}|{names[(g + 7) % GENRES]}" for g in genre.tolist()],
        }
    )
    pacsv.write_csv(catalog, movies)
    return ratings, movies


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _status(pid: int, field: str) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    return next((line.split()[1] for line in status.splitlines() if line.startswith(field)), "")


def _rss_mb(pid: int) -> tuple[str, float]:
    return _status(pid, "Name:"), int(_status(pid, "VmRSS:") or 0) / 1024


@dataclass
class Run:
    engine: str
    rows: int
    neighbours: str
    seconds: float
    peak_mb: float  # the whole process tree at its largest
    driver_mb: float  # the build's own Python process (the Spark engine's driver)
    driver_virtual_mb: float  # its address space at its largest (what ulimit -v limits)
    jvm_mb: float
    code: int
    said: str  # the last line of its log
    recall: float | None
    rank_recall: float | None


def _named(neighbours: str) -> str:
    """What a file's name carries of the neighbours asked for (nothing for the default)."""
    return "" if neighbours == "cosine" else f"-{neighbours}"


def run_build(
    engine: str,
    rows: int,
    ratings: Path,
    movies: Path,
    out: Path,
    limit_gb: float | None = None,
    neighbours: str = "cosine",
) -> Run:
    named = _named(neighbours)
    world = out / f"world-{engine}-{rows}{named}"
    argv = [
        str(Path(sys.executable).parent / "recsys"), "build-world", "--world", str(world),
        "--interactions", str(ratings), "--user-col", "userId", "--item-col", "movieId",
        "--weight-col", "rating", "--min-weight", "3.5", "--items", str(movies),
        "--item-id-col", "movieId", "--category-col", "genres", "--engine", engine,
        "--item-features", "on", "--als-regularization", "10", "--neighbours", neighbours,
    ]  # fmt: skip
    if engine == "spark":
        argv += ["--spark-master", "local[2]", "--spark-conf", "spark.driver.memory=4g"]
    if limit_gb is not None:
        argv = ["prlimit", f"--as={int(limit_gb * 2**30)}", "--", *argv]
    log_path = out / f"build-{engine}-{rows}{named}{'-limited' if limit_gb else ''}.log"
    peaks = {"tree": 0.0, "driver": 0.0, "jvm": 0.0, "virtual": 0.0}
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        child = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                tree = [_rss_mb(pid) for pid in _tree(child.pid)]
                peaks["tree"] = max(peaks["tree"], sum(mb for _, mb in tree))
                peaks["driver"] = max(peaks["driver"], tree[0][1] if tree else 0.0)
                jvm = sum(mb for name, mb in tree if name == "java")
                peaks["jvm"] = max(peaks["jvm"], jvm)
                virtual = int(_status(child.pid, "VmPeak:") or 0) / 1024
                peaks["virtual"] = max(peaks["virtual"], virtual)
                done.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = child.wait()
        done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    recall = rank = None
    if code == 0:
        report = json.loads((world / REPORT_FILE).read_text())
        recall = report["evaluation"]["stages"]["recall"]["recall@10"]
        rank = report["evaluation"]["stages"]["rank"]["recall@10"]
    return Run(
        engine, rows, neighbours, round(seconds, 1), round(peaks["tree"]), round(peaks["driver"]),
        round(peaks["virtual"]), round(peaks["jvm"]), code, lines[-1] if lines else "",
        recall, rank,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,5000000,25000000")
    parser.add_argument("--engines", default="local,spark")
    parser.add_argument("--out", type=Path, default=Path("var/world_scale"))
    parser.add_argument("--memory-limit-gb", type=float, default=None)
    parser.add_argument(
        "--neighbours",
        choices=("cosine", "ease"),
        default="cosine",
        help="the build's item neighbours (build-world --neighbours)",
    )
    args = parser.parse_args()
    results = []
    for rows in [int(size) for size in args.sizes.split(",")]:
        ratings, movies = write_log(args.out / "logs", rows)
        runs = [(engine, None) for engine in args.engines.split(",")]
        if args.memory_limit_gb is not None:
            runs.insert(0, ("local", args.memory_limit_gb))
        for engine, limit in runs:
            run = run_build(engine, rows, ratings, movies, args.out, limit, args.neighbours)
            results.append({**asdict(run), "limit_gb": limit})
            print(json.dumps(results[-1]), flush=True)
    scale = args.out / f"scale{_named(args.neighbours)}.json"
    scale.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
