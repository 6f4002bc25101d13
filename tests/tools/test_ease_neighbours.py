"""EASE's item weights as the world's neighbours (build-world --neighbours ease): each item's
k largest positive weights of B = -P / diag(P), P = (XᵀX + λI)⁻¹, over the binary matrix
of each user's latest positives; past the most items it fits, over those most users chose."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from recsys_tools.world.commands import register
from recsys_tools.world.learn.neighbours import (
    COSINE,
    NeighbourModel,
    check_ease_memory,
    ease_items,
    item_neighbours,
    largest_weights,
)
from recsys_tools.world.recipes.report import built_neighbours

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE

EASE = NeighbourModel("ease", lam=5.0)


def _log(seed: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """40 users, 30 items, each user choosing 6 of one half of the catalog: two tastes."""
    rng = np.random.default_rng(seed)
    users, items = [], []
    for user in range(40):
        half = (user % 2) * 15
        chosen = rng.choice(15, size=6, replace=False) + half
        users += [user] * 6
        items += chosen.tolist()
    return np.asarray(users), np.asarray(items), 40, 30


def _reference(users: np.ndarray, items: np.ndarray, n_users: int, n_items: int) -> np.ndarray:
    """B by the paper's formula over the dense matrix, the diagonal out."""
    x = np.zeros((n_users, n_items))
    x[users, items] = 1.0
    return _weights(x)


def _weights(x: np.ndarray) -> np.ndarray:
    p = np.linalg.inv(x.T @ x + EASE.lam * np.eye(x.shape[1]))
    weights: np.ndarray = p / -np.diag(p)
    np.fill_diagonal(weights, 0.0)
    return weights


def test_each_items_neighbours_are_its_largest_positive_weights() -> None:
    users, items, n_users, n_items = _log(3)
    found = item_neighbours(users, items, n_users, n_items, k=5, model=EASE)
    weights = _reference(users, items, n_users, n_items)
    for item in range(n_items):
        expected = [j for j in np.argsort(-weights[item], kind="stable") if weights[item, j] > 0]
        listed = found.positions[item][found.positions[item] >= 0]
        assert listed.tolist() == expected[:5], item
        assert found.similarity[item, : len(listed)] == pytest.approx(
            weights[item, listed], rel=1e-5
        )
        # Two tastes: an item's neighbours are of its own half of the catalog.
        assert all((j < 15) == (item < 15) for j in listed.tolist())


def test_an_item_nobody_chose_has_no_neighbours_and_is_nobodys() -> None:
    users, items, n_users, _ = _log(4)
    found = item_neighbours(users, items, n_users, 31, k=5, model=EASE)  # item 30 unchosen
    assert (found.positions[30] == -1).all()
    assert 30 not in found.positions


def test_past_the_most_items_it_fits_it_fits_those_most_users_chose() -> None:
    users, items, n_users, n_items = _log(5)
    chosen_by = np.bincount(items, minlength=n_items)
    # The 20 most chosen, ties to the lower index: the rest of the 30 have no neighbours and
    # are nobody's; the 20's neighbours are EASE's over them alone.
    head = np.sort(np.lexsort((np.arange(n_items), -chosen_by))[:20])
    found = item_neighbours(users, items, n_users, n_items, k=5, model=replace(EASE, max_items=20))
    listed = found.positions[found.positions >= 0]
    assert set(np.flatnonzero(found.positions[:, 0] >= 0).tolist()) == set(head.tolist())
    assert set(listed.tolist()) <= set(head.tolist())
    x = np.zeros((n_users, n_items))
    x[users, items] = 1.0
    weights = _weights(x[:, head])
    for row, item in enumerate(head.tolist()):
        expected = [
            head[j] for j in np.argsort(-weights[row], kind="stable") if weights[row, j] > 0
        ]
        assert found.positions[item][found.positions[item] >= 0].tolist() == expected[:5]


def test_the_items_it_fits_are_the_most_chosen_ties_to_the_lower_index() -> None:
    counts = np.array([3, 0, 5, 3, 1, 3, 0], dtype=np.int64)
    assert ease_items(counts, 10).tolist() == [0, 2, 3, 4, 5]  # every item chosen at all
    assert ease_items(counts, 5).tolist() == [0, 2, 3, 4, 5]
    assert ease_items(counts, 3).tolist() == [0, 2, 3]  # of the three 3s, the lower two
    assert ease_items(counts, 1).tolist() == [2]


def test_ties_at_the_cut_go_to_the_lower_index() -> None:
    # Four equal weights for two places: whichever two a partition leaves in front, the two
    # lowest positions are kept, then in order; the diagonal (-inf) and no weight <= 0 ever.
    row = np.array([0.5, -np.inf, 0.5, 0.9, 0.5, 0.5, 0.0, -0.2])
    for depth, expected in ((1, [3]), (2, [3, 0]), (3, [3, 0, 2]), (7, [3, 0, 2, 4, 5])):
        assert largest_weights(row, depth).tolist() == expected
    backwards = row[::-1].copy()
    for depth, expected in ((2, [4, 2]), (3, [4, 2, 3]), (7, [4, 2, 3, 5, 7])):
        assert largest_weights(backwards, depth).tolist() == expected


@pytest.mark.parametrize(
    ("kind", "lam", "most"),
    [
        ("EASE", 200.0, 10),
        ("ease", 0.0, 10),
        ("ease", 1e300, 10),
        ("ease", 5.0, 1),
        ("ease", 5.0, 40_001),
        ("ease", 5.0, -3),
        ("ease", 5.0, 1e4),  # a float: its count would reach report.json as 10000.0
        ("ease", 5.0, True),
        ("ease", 5.0, np.int64(500)),  # JSON cannot write one
    ],
)
def test_a_model_past_its_range_is_refused(kind: str, lam: float, most: object) -> None:
    with pytest.raises(ConfigError):
        NeighbourModel(kind, lam, most)  # type: ignore[arg-type]


def test_the_flags_refuse_eases_settings_without_ease_and_past_their_range(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    base = ["build-world", "--interactions", str(tmp_path / "log.csv"), "--world", str(tmp_path)]
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--neighbours", "ease", "--ease-lambda", "-1"])
    args = parser.parse_args([*base, "--ease-lambda", "5"])
    with pytest.raises(ConfigError, match="--ease-lambda is EASE's"):
        args.run(args)
    args = parser.parse_args([*base, "--ease-max-items", "500"])
    with pytest.raises(ConfigError, match="--ease-max-items is EASE's"):
        args.run(args)
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--neighbours", "ease", "--ease-max-items", "many"])
    args = parser.parse_args([*base, "--neighbours", "ease", "--ease-max-items", "1"])
    with pytest.raises(ConfigError, match="EASE fits at most 1 items: give a whole number from 2"):
        args.run(args)


@pytest.mark.parametrize(
    ("report", "model"),
    [
        (None, COSINE),
        ({"neighbours": {"model": "cosine"}}, COSINE),
        ({"ranker": {}}, COSINE),
        ({"neighbours": {"model": "ease", "lambda": 50}}, NeighbourModel("ease", 50.0)),
        (
            {"neighbours": {"model": "ease", "lambda": 50, "max_items": 300}},
            NeighbourModel("ease", 50.0, 300),
        ),
        (
            {"neighbours": {"model": "ease", "lambda": 50, "max_items": 300.0}},
            NeighbourModel("ease", 50.0, 300),
        ),
    ],
)
def test_a_retrain_keeps_the_neighbours_the_world_was_built_with(
    tmp_path: Path, report: dict[str, object] | None, model: NeighbourModel
) -> None:
    if report is not None:
        (tmp_path / REPORT_FILE).write_text(json.dumps(report))
    assert built_neighbours(tmp_path) == model


@pytest.mark.parametrize(
    "said",
    [
        {"lambda": 0},
        {"max_items": 1},
        {"max_items": 3.5},
        {"max_items": True},
        {"max_items": "300"},
        {"max_items": None},
        {"max_items": 10**30},
    ],
)
def test_a_report_with_a_model_past_its_range_is_refused_naming_it(
    tmp_path: Path, said: dict[str, object]
) -> None:
    (tmp_path / REPORT_FILE).write_text(json.dumps({"neighbours": {"model": "ease", **said}}))
    with pytest.raises(ConfigError, match=r"report\.json: neighbours"):
        built_neighbours(tmp_path)


def test_a_report_that_is_not_json_is_refused_not_read_as_cosine(tmp_path: Path) -> None:
    (tmp_path / REPORT_FILE).write_text("{")
    with pytest.raises(ConfigError, match=r"report\.json is not the build's JSON report"):
        built_neighbours(tmp_path)


def test_an_ease_past_the_processs_memory_limit_is_refused_before_learning() -> None:
    limit = (2**30, "its cgroup's memory limit")
    big = NeighbourModel("ease", max_items=20_000)
    # 20,000 items squared of float64 is 3.2 GB, past a 1 GiB limit; the items with
    # positives bound what is fitted.
    with pytest.raises(ConfigError, match=r"20,000 items needs about 3\.0 GiB.*--ease-max-items"):
        check_ease_memory(50_000, big, limit)
    check_ease_memory(5_000, big, limit)
    check_ease_memory(50_000, big, None)
