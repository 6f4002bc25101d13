"""EASE, the baseline the served answers are held against: it must be the model it claims."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log

from loadtest import ease, ease_blend

COLUMNS = LogColumns(user="user", item="item", weight="rating", min_weight=4.0)


def _log(path: Path, rows: list[tuple[str, str, float, int]]) -> InteractionLog:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user", "item", "rating", "timestamp"])
        writer.writerows(rows)
    return read_log(path, COLUMNS)


def _earlier(path: Path) -> InteractionLog:
    # Six users like a and b together; c is liked alone by two; d is only ever rated low.
    rows = [(f"u{n}", item, 5.0, n) for n in range(6) for item in ("a", "b")]
    rows += [("u6", "c", 5.0, 1), ("u7", "c", 5.0, 1), ("u8", "a", 5.0, 1)]
    rows += [(f"u{n}", "d", 1.0, 2) for n in range(6)]
    return _log(path, rows)


def test_a_user_who_liked_a_is_offered_what_a_is_liked_with(tmp_path: Path) -> None:
    model = ease.fit(_earlier(tmp_path / "earlier.csv"), lam=1.0)
    assert model.top(["a"], seen={"a"}, k=1) == ["b"]
    # Popularity counts each user's like once, and only likes.
    assert dict(zip(model.ids, model.popularity.tolist(), strict=True)) == {
        "a": 7,
        "b": 6,
        "c": 2,
    }


def test_every_row_learns_from_the_items_rated_low_too(tmp_path: Path) -> None:
    earlier = _earlier(tmp_path / "earlier.csv")
    assert "d" not in ease.fit(earlier, lam=1.0).items
    every = ease.fit(earlier, lam=1.0, every_row=True)
    assert "d" in every.items
    # Asked with everything u8 touched (a), d comes with a as often as b does.
    assert set(every.top(["a"], seen={"a"}, k=2)) == {"b", "d"}


def test_at_its_best_is_the_best_it_tried_on_the_judged_part(tmp_path: Path) -> None:
    earlier = _earlier(tmp_path / "earlier.csv")
    later = _log(tmp_path / "later.csv", [("u8", "b", 5.0, 9), ("u6", "a", 5.0, 9)])
    best = ease.best_on_the_judged_part(earlier, later)
    assert len(best["tried"]) == len(ease.UPPER_LAMBDAS) * len(ease.INPUTS)
    assert best["recall@10"] == max(best["tried"].values())
    assert best["tried"][best["chosen"]] == best["recall@10"]
    assert best["recall@10"] > 0.0  # u8 liked a: b is in their ten


def test_both_sides_give_one_model(tmp_path: Path) -> None:
    # Fewer users than items, so fit takes the users' side by itself: the item-by-item B
    # must score every history alike, and so answer alike. A pair rated twice is one 1.
    rng = np.random.default_rng(3)
    rows = [
        (f"u{user}", f"i{item}", float(rng.integers(1, 6)), int(rng.integers(0, 1000)))
        for user in range(12)
        for item in rng.choice(40, size=int(rng.integers(2, 9)), replace=False).tolist()
    ]
    rows += [(user, item, 5.0, 2000) for user, item, _, _ in rows[::5]]
    earlier = _log(tmp_path / "earlier.csv", rows)
    for every_row in (False, True):
        users = ease.fit(earlier, lam=2.0, every_row=every_row)
        items = ease.fit(earlier, lam=2.0, every_row=every_row, side="items")
        assert isinstance(users.scores, ease.UserSide)
        assert isinstance(items.scores, ease.ItemSide)
        assert users.ids == items.ids
        for history in ([0], [3, 7], [1, 1, 5], list(range(len(users.ids)))):
            np.testing.assert_allclose(users.scores(history), items.scores(history), atol=1e-9)
        liked = [users.ids[0], users.ids[4]]
        assert users.top(liked, set(liked), k=5) == items.top(liked, set(liked), k=5)


def test_weighted_scores_are_one_x_b_on_both_sides(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = [
        (f"u{user}", f"i{item}", 5.0, int(rng.integers(0, 1000)))
        for user in range(10)
        for item in rng.choice(30, size=6, replace=False).tolist()
    ]
    earlier = _log(tmp_path / "earlier.csv", rows)
    users = ease.fit(earlier, lam=2.0)
    items = ease.fit(earlier, lam=2.0, side="items")
    x = rng.random(len(users.ids))
    np.testing.assert_allclose(users.scores.weighted(x), items.scores.weighted(x), atol=1e-9)
    counts = np.bincount([2, 2, 7], minlength=len(users.ids)).astype(np.float64)
    np.testing.assert_allclose(users.scores.weighted(counts), items.scores([2, 2, 7]), atol=1e-9)


def test_the_blend_bound_reads_the_latest_positive_and_is_never_below_ease(
    tmp_path: Path,
) -> None:
    # Items pair up (p0, q0), (p1, q1)...: teachers like each pair together. Each asked
    # user liked twelve p's long ago and one lately; later they like the latest one's q.
    # EASE over everything ranks thirteen q's alike; the latest positive singles one out.
    rng = np.random.default_rng(11)
    rows = [
        (f"t{n}-{k}", f"{side}{k}", 5.0, 0) for k in range(30) for n in range(3) for side in "pq"
    ]
    later = []
    for user in range(40):
        old = rng.choice(30, size=13, replace=False).tolist()
        rows += [(f"u{user}", f"p{k}", 5.0, 1 + at) for at, k in enumerate(old)]
        later.append((f"u{user}", f"q{old[-1]}", 5.0, 100))
    earlier = _log(tmp_path / "earlier.csv", rows)
    judged_part = _log(tmp_path / "later.csv", later)
    model = ease.fit(earlier, lam=1.0)
    on = ease_blend.judged(model, earlier, judged_part)
    assert on.liking.all()
    assert on.lately is not None  # the log has times
    best = ease_blend.best_blend(model, on)
    assert best["blend"]["recall@10"] > best["ease_alone"]["recall@10"]
    assert best["blend"]["recent"] > 0
    assert best["blend"]["window"]["latest"] in {w for w, _ in ease_blend.WINDOWS}
