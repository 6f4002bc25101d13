"""A generated ratings log whose catalog grows: items come out every day, and users choose
mostly among what came out lately, as in a shop's new arrivals or a news site.

Items fall in genres, each with a few title words of its own; every day each genre releases
a few items. Each user follows one or two genres and, at each visit, rates an item of theirs
released within the last `shelf_days`, the newer and the more popular the likelier. A world
built from the log before a day knows none of the items released after it, and many of the
later positives are on those. Files: log.csv (user_id,item_id,rating,timestamp), items.csv
(item_id,genre,title,released) and, for the build, items_before.csv: the items released
before the cut.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DAY = 86_400
START = 1_700_000_000
WORDS = (
    "harbor", "ember", "north", "quiet", "signal", "velvet", "orbit", "meadow", "copper",
    "island", "lantern", "river", "atlas", "frost", "garden", "thunder", "echo", "saffron",
    "granite", "willow", "comet", "delta", "prism", "canyon",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ArrivalShape:
    genres: int = 12
    days: int = 60
    per_genre_day: int = 3
    users: int = 900
    visits: tuple[int, int] = (8, 20)  # per user, over the whole span
    shelf_days: int = 10
    cut_day: int = 48  # the build's log ends here

    @property
    def items(self) -> int:
        return self.genres * self.days * self.per_genre_day


@dataclass(frozen=True, slots=True)
class ArrivalLog:
    log: Path
    items: Path
    items_before: Path
    since: int  # the first second after the cut


def _item(genre: int, day: int, k: int, shape: ArrivalShape) -> int:
    return (day * shape.genres + genre) * shape.per_genre_day + k


def _rows(shape: ArrivalShape, rng: np.random.Generator) -> list[tuple[str, str, float, int]]:
    appeal = rng.pareto(2.0, size=shape.items) + 0.2  # some items simply please more
    rows: list[tuple[str, str, float, int]] = []
    for user in range(shape.users):
        genres = rng.choice(shape.genres, size=int(rng.integers(1, 3)), replace=False)
        visits = np.sort(rng.uniform(0, shape.days * DAY, int(rng.integers(*shape.visits))))
        taken: set[int] = set()
        for moment in visits.astype(int).tolist():
            today = moment // DAY
            genre = int(rng.choice(genres))
            first = max(0, today - shape.shelf_days + 1)
            shelf = [
                _item(genre, day, k, shape)
                for day in range(first, today + 1)
                for k in range(shape.per_genre_day)
            ]
            shelf = [item for item in shelf if item not in taken]
            if not shelf:
                continue
            age = np.array([today - item // (shape.genres * shape.per_genre_day) for item in shelf])
            weights = appeal[shelf] * 0.8**age
            item = int(rng.choice(shelf, p=weights / weights.sum()))
            taken.add(item)
            rating = float(rng.choice([4.0, 4.5, 5.0]))
            rows.append((f"u{user}", f"n{item}", rating, START + moment))
    rows.sort(key=lambda row: row[3])
    return rows


def _item_rows(shape: ArrivalShape, rng: np.random.Generator) -> list[tuple[str, str, str, int]]:
    words = np.array(WORDS)
    own = [rng.choice(len(WORDS), size=3, replace=False) for _ in range(shape.genres)]
    rows = []
    for day in range(shape.days):
        for genre in range(shape.genres):
            for k in range(shape.per_genre_day):
                title = f"{words[rng.choice(own[genre])]} {words[rng.integers(len(WORDS))]} {k}"
                item = _item(genre, day, k, shape)
                rows.append((f"n{item}", f"g{genre}", title.title(), START + day * DAY))
    return rows


def write_arrival_log(folder: Path, seed: int = 5, shape: ArrivalShape | None = None) -> ArrivalLog:
    shape = shape or ArrivalShape()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    since = START + shape.cut_day * DAY
    paths = ArrivalLog(folder / "log.csv", folder / "items.csv", folder / "items_before.csv", since)
    with paths.log.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "item_id", "rating", "timestamp"])
        writer.writerows(_rows(shape, rng))
    items = _item_rows(shape, rng)
    for path, chosen in (
        (paths.items, items),
        (paths.items_before, [r for r in items if r[3] < since]),
    ):
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["item_id", "genre", "title", "released"])
            writer.writerows(chosen)
    return paths
