"""A generated ratings log with planted sequential behaviour: sessions of related items.

Items fall in themes (a few dozen related items each: a series, a director, a style), and
themes in genres. Each user has a favourite genre, but spends each session on one theme,
rating several of its items one after the other; most sessions stay in the favourite genre,
some stray. What the user will rate next is best told by what they rated last (the theme of
the session under way), less by their long-run taste: a model that only knows the user's
vector averages over every theme they touched. One file, columns
user_id,item_id,rating,timestamp, in the form `recsys build-world` reads; and, beside it if
asked, the item table (item_id,genre): what a catalog would say of each item.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HOUR = 3_600
DAY = 86_400
START = 1_700_000_000


@dataclass(frozen=True, slots=True)
class SessionShape:
    genres: int = 8
    themes_per_genre: int = 12
    items_per_theme: int = 30
    users: int = 1200
    sessions: tuple[int, int] = (3, 6)  # per user, low and high (inclusive)
    session_length: tuple[int, int] = (6, 12)
    favourite_share: float = 0.7  # sessions spent in the user's favourite genre

    @property
    def items(self) -> int:
        return self.genres * self.themes_per_genre * self.items_per_theme


def _theme_items(
    rng: np.random.Generator, theme: int, shape: SessionShape, count: int, taken: set[int]
) -> list[int]:
    """`count` items of the theme the user has not rated, its popular ones more often."""
    first = theme * shape.items_per_theme
    weights = 1.0 / np.arange(1, shape.items_per_theme + 1) ** 0.7
    free = np.array([first + k not in taken for k in range(shape.items_per_theme)])
    if not free.any():
        return []
    weights = np.where(free, weights, 0.0)
    count = min(count, int(free.sum()))
    chosen = rng.choice(shape.items_per_theme, size=count, replace=False, p=weights / weights.sum())
    return [first + int(k) for k in chosen]


def session_rows(shape: SessionShape, seed: int) -> list[tuple[str, str, float, int]]:
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, str, float, int]] = []
    themes = shape.genres * shape.themes_per_genre
    for user in range(shape.users):
        favourite = int(rng.integers(shape.genres))
        moment = START + int(rng.integers(0, 30 * DAY))
        taken: set[int] = set()
        for _ in range(int(rng.integers(shape.sessions[0], shape.sessions[1] + 1))):
            if rng.random() < shape.favourite_share:
                theme = favourite * shape.themes_per_genre + int(
                    rng.integers(shape.themes_per_genre)
                )
            else:
                theme = int(rng.integers(themes))
            length = int(rng.integers(shape.session_length[0], shape.session_length[1] + 1))
            for item in _theme_items(rng, theme, shape, length, taken):
                taken.add(item)
                moment += int(rng.integers(60, 2 * HOUR))
                rating = float(rng.choice([4.0, 4.5, 5.0]))
                rows.append((f"u{user}", f"i{item}", rating, moment))
            moment += int(rng.integers(DAY, 10 * DAY))
    return rows


def write_session_items(path: Path, shape: SessionShape | None = None) -> Path:
    """Each item's genre (its theme's), as an item table `--items --category-col genre`
    reads."""
    shape = shape or SessionShape()
    per_genre = shape.themes_per_genre * shape.items_per_theme
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["item_id", "genre"])
        writer.writerows((f"i{item}", f"g{item // per_genre}") for item in range(shape.items))
    return path


def write_session_log(path: Path, seed: int = 3, shape: SessionShape | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "item_id", "rating", "timestamp"])
        writer.writerows(session_rows(shape or SessionShape(), seed))
    return path
