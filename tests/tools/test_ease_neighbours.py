"""EASE's item weights as the world's neighbours (build-world --neighbours ease): each item's
k largest positive weights of B = -P / diag(P), P = (XᵀX + λI)⁻¹, over the binary matrix
of each user's latest positives; refused past the ceiling on items."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from recsys_tools.world.commands import register
from recsys_tools.world.learn.neighbours import (
    COSINE,
    NeighbourModel,
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
    p = np.linalg.inv(x.T @ x + EASE.lam * np.eye(n_items))
    weights = p / -np.diag(p)
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


def test_past_the_ceiling_it_is_refused_saying_what_to_build_with() -> None:
    users, items, n_users, n_items = _log(5)
    small = NeighbourModel("ease", max_items=20)
    with pytest.raises(ConfigError, match=r"30 items, past the ceiling of 20.*neighbours cosine"):
        item_neighbours(users, items, n_users, n_items, model=small)


def test_ties_at_the_cut_go_to_the_lower_index() -> None:
    # Four equal weights for two places: whichever two a partition leaves in front, the two
    # lowest positions are kept, then in order; the diagonal (-inf) and no weight <= 0 ever.
    row = np.array([0.5, -np.inf, 0.5, 0.9, 0.5, 0.5, 0.0, -0.2])
    for depth, expected in ((1, [3]), (2, [3, 0]), (3, [3, 0, 2]), (7, [3, 0, 2, 4, 5])):
        assert largest_weights(row, depth).tolist() == expected
    backwards = row[::-1].copy()
    for depth, expected in ((2, [4, 2]), (3, [4, 2, 3]), (7, [4, 2, 3, 5, 7])):
        assert largest_weights(backwards, depth).tolist() == expected


@pytest.mark.parametrize(("kind", "lam"), [("EASE", 200.0), ("ease", 0.0), ("ease", 1e300)])
def test_a_model_past_its_range_is_refused(kind: str, lam: float) -> None:
    with pytest.raises(ConfigError):
        NeighbourModel(kind, lam)  # type: ignore[arg-type]


def test_the_flags_refuse_a_lambda_without_ease(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    base = ["build-world", "--interactions", str(tmp_path / "log.csv"), "--world", str(tmp_path)]
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--neighbours", "ease", "--ease-lambda", "-1"])
    args = parser.parse_args([*base, "--ease-lambda", "5"])
    with pytest.raises(ConfigError, match="--ease-lambda is EASE's"):
        args.run(args)


@pytest.mark.parametrize(
    ("report", "model"),
    [
        (None, COSINE),
        ({"neighbours": {"model": "cosine"}}, COSINE),
        ({"ranker": {}}, COSINE),
        ({"neighbours": {"model": "ease", "lambda": 50}}, NeighbourModel("ease", 50.0)),
    ],
)
def test_a_retrain_keeps_the_neighbours_the_world_was_built_with(
    tmp_path: Path, report: dict[str, object] | None, model: NeighbourModel
) -> None:
    if report is not None:
        (tmp_path / REPORT_FILE).write_text(json.dumps(report))
    assert built_neighbours(tmp_path) == model


def test_a_report_with_a_lambda_past_the_range_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / REPORT_FILE).write_text(json.dumps({"neighbours": {"model": "ease", "lambda": 0}}))
    with pytest.raises(ConfigError, match=r"report\.json: neighbours"):
        built_neighbours(tmp_path)


def test_a_report_that_is_not_json_is_refused_not_read_as_cosine(tmp_path: Path) -> None:
    (tmp_path / REPORT_FILE).write_text("{")
    with pytest.raises(ConfigError, match=r"report\.json is not the build's JSON report"):
        built_neighbours(tmp_path)
