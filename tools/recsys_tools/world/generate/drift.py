"""A generated ratings log whose users' tastes drift: what a static model cannot follow.

Items fall in interest groups (each with a popular head). In the history, every known user
rates a few items of one group highly. Later, most of them move to another group, some stay,
and new users arrive: a model built on the history knows the old tastes only, while a
service that folds each rating in follows the move after the first few. Two files:
history.csv (build the world from it) and later.csv (replay it), columns
user_id,item_id,rating,timestamp.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DAY = 86_400
START = 1_700_000_000


@dataclass(frozen=True, slots=True)
class DriftLog:
    history: Path
    later: Path
    since: int  # the first second of the later part


@dataclass(frozen=True, slots=True)
class DriftShape:
    groups: int = 20
    items_per_group: int = 200
    users: int = 1000
    history_per_user: int = 6
    later_per_user: int = 8
    moving_share: float = 0.6  # known users who move to another group later
    new_share: float = 0.3  # later users who were not in the history at all


def _pick(rng: np.random.Generator, group: int, shape: DriftShape, count: int) -> list[int]:
    """`count` distinct items of the group, popular ones more often (Zipf-like)."""
    weights = 1.0 / np.arange(1, shape.items_per_group + 1) ** 0.8
    chosen = rng.choice(shape.items_per_group, size=count, replace=False, p=weights / weights.sum())
    return [group * shape.items_per_group + int(c) for c in chosen]


def _write(path: Path, rows: list[tuple[str, str, float, int]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "item_id", "rating", "timestamp"])
        writer.writerows(rows)
    return path


def write_drift_log(folder: Path, seed: int = 5, shape: DriftShape | None = None) -> DriftLog:
    shape = shape or DriftShape()
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    history: list[tuple[str, str, float, int]] = []
    later: list[tuple[str, str, float, int]] = []
    since = START + 30 * DAY
    known = int(shape.users * (1 - shape.new_share))
    for user in range(shape.users):
        name = f"u{user}"
        group = int(rng.integers(shape.groups))
        if user < known:
            for item in _pick(rng, group, shape, shape.history_per_user):
                ts = START + int(rng.integers(30 * DAY))
                history.append((name, f"i{item}", float(rng.choice([4.0, 5.0])), ts))
            if rng.random() < shape.moving_share:
                group = (group + 1 + int(rng.integers(shape.groups - 1))) % shape.groups
        picked = _pick(rng, group, shape, shape.later_per_user)
        times = np.sort(since + rng.integers(10 * DAY, size=len(picked)))
        for item, ts in zip(picked, times.tolist(), strict=True):
            later.append((name, f"i{item}", float(rng.choice([4.0, 5.0])), int(ts)))
    # Every item rated at least once in the history, so the catalog holds all of them.
    for item in range(shape.groups * shape.items_per_group):
        history.append((f"c{item % 50}", f"i{item}", 3.0, START + int(rng.integers(30 * DAY))))
    history.sort(key=lambda row: row[3])
    later.sort(key=lambda row: row[3])
    return DriftLog(
        _write(folder / "history.csv", history), _write(folder / "later.csv", later), since
    )


@dataclass(frozen=True, slots=True)
class DailyShape:
    """Tastes that drift day by day: each day a user may move to another group."""

    groups: int = 20
    items_per_group: int = 200
    users: int = 1000
    history_days: int = 30
    later_days: int = 7
    active_share: float = 0.5  # users who rate something on a given day
    per_day: int = 2  # items an active user rates that day
    daily_move: float = 0.12  # chance a user moves to another group, each day
    # Chance an item leaves its group for another, each day: what users like together
    # changes, which folding users in cannot follow (the items' vectors are the world's).
    item_move: float = 0.0


@dataclass(frozen=True, slots=True)
class DailyDrift:
    """Rows (user_id, item_id, rating, timestamp) by part: the history a world is built from,
    the later days an archive keeps, and the day after them to judge on."""

    history: list[tuple[str, str, float, int]]
    later: list[tuple[str, str, float, int]]
    next_day: list[tuple[str, str, float, int]]
    next_day_start: int  # its first second
    # Each day's interest group of every user and of every item (u3 is user 3, i7 item 7):
    # what a generated user would choose among items shown to them.
    user_groups: list[np.ndarray] = field(default_factory=list)
    item_groups: list[np.ndarray] = field(default_factory=list)

    def likes(self, day: int, user: str, item: str) -> bool:
        """Whether the user's taste on day `day` (0: the first of the history) is the
        item's group."""
        groups = self.user_groups[day], self.item_groups[day]
        return bool(groups[0][int(user[1:])] == groups[1][int(item[1:])])

    def write_history(self, path: Path) -> Path:
        return _write(path, self.history)


def daily_drift(seed: int = 5, shape: DailyShape | None = None) -> DailyDrift:
    shape = shape or DailyShape()
    rng = np.random.default_rng(seed)
    group = rng.integers(shape.groups, size=shape.users)
    had: list[set[int]] = [set() for _ in range(shape.users)]
    days: list[list[tuple[str, str, float, int]]] = []
    user_groups: list[np.ndarray] = []
    item_groups: list[np.ndarray] = []
    total = shape.history_days + shape.later_days + 1
    n_items = shape.groups * shape.items_per_group
    item_group = np.arange(n_items) // shape.items_per_group
    appeal = 1.0 / (np.arange(n_items) % shape.items_per_group + 1) ** 0.8
    for day in range(total):
        moving = rng.random(shape.users) < shape.daily_move
        shift = 1 + rng.integers(shape.groups - 1, size=shape.users)
        group = np.where(moving, (group + shift) % shape.groups, group)
        if day >= shape.history_days and shape.item_move > 0:
            leaving = rng.random(n_items) < shape.item_move
            item_group = np.where(leaving, rng.integers(shape.groups, size=n_items), item_group)
        members = [np.flatnonzero(item_group == g) for g in range(shape.groups)]
        user_groups.append(group.copy())
        item_groups.append(item_group.copy())
        rows = []
        for user in np.flatnonzero(rng.random(shape.users) < shape.active_share).tolist():
            pool = members[int(group[user])]
            weights = appeal[pool] / appeal[pool].sum()
            size = min(len(pool), shape.per_day + 2)
            picked = rng.choice(pool, size=size, replace=False, p=weights).tolist()
            fresh = [item for item in picked if item not in had[user]][: shape.per_day]
            for item in fresh:
                had[user].add(item)
                ts = START + day * DAY + int(rng.integers(DAY))
                rows.append((f"u{user}", f"i{item}", float(rng.choice([4.0, 5.0])), ts))
        days.append(sorted(rows, key=lambda row: row[3]))
    history = [row for day in days[: shape.history_days] for row in day]
    # Every item rated once in the history, so the catalog holds all of them.
    for item in range(shape.groups * shape.items_per_group):
        ts = START + int(rng.integers(shape.history_days * DAY))
        history.append((f"c{item % 50}", f"i{item}", 3.0, ts))
    history.sort(key=lambda row: row[3])
    later = [row for day in days[shape.history_days : -1] for row in day]
    next_start = START + (total - 1) * DAY
    return DailyDrift(history, later, days[-1], next_start, user_groups, item_groups)
