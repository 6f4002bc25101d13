"""The order model as the build learns it: what it serves is what it trained, it finds an
order planted in a log, and a build that cannot learn one says why."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from recsys_tools.cli import main
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.learn.order import OrderShape, _Net, fit_order, with_order
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.core.errors import ConfigError
from app.world.schema import load_schema, parse_schema

COLUMNS = LogColumns(weight="rating", min_weight=4.0)
CYCLE = 30
SMALL = OrderShape(hidden=16, epochs=30, patience=4)


def _log(
    path: Path, rows: list[tuple[str, str, int, float]], columns: LogColumns
) -> InteractionLog:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "item_id", "timestamp", "rating"])
        writer.writerows(rows)
    return read_log(path, columns)


def _cycling(path: Path, users: int = 150, steps: int = 14) -> InteractionLog:
    """Each user likes items in the order of a cycle, i then i + 1, from a start of their own;
    a low rating now and then is no positive and no step."""
    rng = np.random.default_rng(5)
    rows = []
    for user in range(users):
        start = int(rng.integers(CYCLE))
        for step in range(steps):
            rows.append((f"u{user}", f"i{(start + step) % CYCLE}", 1000 + 10 * step, 5.0))
        rows.append((f"u{user}", f"i{int(rng.integers(CYCLE))}", 1005, 1.0))
    return _log(path, rows, COLUMNS)


def test_what_is_served_is_the_network_that_was_trained() -> None:
    torch.manual_seed(2)
    items = 15
    net = _Net(items, 6)
    rng = np.random.default_rng(0)
    windows = np.full((8, 5), items, dtype=np.int64)  # left-padded, as the examples are
    for row in range(8):
        length = row % 5 + 1
        windows[row, 5 - length :] = rng.integers(0, items, size=length)
    with torch.no_grad():
        logits = net.logits(windows).numpy()
    served = net.served()
    for window, expected in zip(windows, logits, strict=True):
        scores = served.taste(window[window < items]).scores(np.arange(items))
        # Stored less the catalog's mean: each score is over the average item's.
        np.testing.assert_allclose(scores, expected - expected.mean(), atol=1e-4)


def test_the_model_finds_the_order_planted_in_a_log(tmp_path: Path) -> None:
    log = _cycling(tmp_path / "log.csv")
    model, report = fit_order(log, seed=3, shape=SMALL)
    assert report.checking_users == 150
    assert report.checking_hit_at_10 > 0.8, report
    position = {item: k for k, item in enumerate(log.items.ids.tolist())}
    named = 0
    for start in range(CYCLE):
        window = [position[f"i{(start + step) % CYCLE}"] for step in range(3)]
        scores = model.taste(np.array(window, np.int64)).scores(np.arange(log.n_items))
        following = scores[position[f"i{(start + 3) % CYCLE}"]]
        named += int((scores > following).sum()) < 3  # among the model's first three
    # By chance 3 in 30; seeds 1 to 6 gave 23 to 29.
    assert named >= 2 * CYCLE // 3, named


def test_a_log_with_no_order_to_learn_is_refused(tmp_path: Path) -> None:
    rows = [(f"u{user}", f"i{item}", 100 + item, 5.0) for user in range(20) for item in (1, 2)]
    with pytest.raises(ConfigError, match="nothing to learn from"):
        fit_order(_log(tmp_path / "log.csv", rows, COLUMNS), seed=1, shape=SMALL)


def test_the_order_signal_is_added_last_to_the_schemas_sequence() -> None:
    schema = load_schema(interactions_schema_path())
    ordered = with_order(schema)
    assert ordered.sequence == (*schema.sequence, "order")
    assert ordered.width == schema.width + 1
    assert ordered.blocks["sequence"].stop == schema.blocks["sequence"].stop + 1
    assert with_order(ordered) is ordered
    # The world carries the text it was built for: read back, it is the same schema.
    assert parse_schema(ordered.source) == ordered
    # The packaged demo schema has no sequence block: the order signal brings one.
    bare = load_schema(None)
    assert not bare.sequence
    added = with_order(bare)
    assert added.sequence == ("order",)
    assert added.blocks["sequence"].stop == added.width == bare.width + 1


def test_a_log_without_times_cannot_be_built_with_the_order_model(tmp_path: Path) -> None:
    rows = [(f"u{user}", f"i{item}", 0, 5.0) for user in range(5) for item in range(4)]
    path = tmp_path / "log.csv"
    _log(path, rows, COLUMNS)
    recipe = WorldRecipe(
        interactions=path,
        columns=LogColumns(weight="rating", min_weight=4.0, time=None),
        order_model=True,
    )
    with pytest.raises(ConfigError, match="a log without times"):
        build_world_from_log(recipe, tmp_path / "world", load_schema(interactions_schema_path()))
    assert not (tmp_path / "world").exists()


@pytest.mark.parametrize("asked_by", ["flag", "schema"])
def test_the_spark_engine_refuses_the_order_model_before_it_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, asked_by: str
) -> None:
    path = tmp_path / "log.csv"
    _cycling(path, users=5)
    argv = ["build-world", "--interactions", str(path), "--world", str(tmp_path / "world")]
    argv += ["--weight-col", "rating", "--engine", "spark"]
    if asked_by == "flag":
        argv.append("--order-model")
    else:  # a schema an order world was built with, reused
        schema = tmp_path / "schema.json"
        schema.write_text(with_order(load_schema(interactions_schema_path())).source)
        argv += ["--schema", str(schema)]
    assert main(argv) != 0
    assert "learnt on the local engine only" in caplog.text
    assert not (tmp_path / "world").exists()
