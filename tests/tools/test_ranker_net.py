"""The ranking network: two heads that learn their own labels, an export that computes what
was trained, and the build's choice between shapes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
from recsys_tools.world.judge.measures import auc
from recsys_tools.world.learn.ranker.export import export_net
from recsys_tools.world.learn.ranker.fit import fit_best, fit_net
from recsys_tools.world.learn.ranker.net import DCN, MLP, NetShape
from recsys_tools.world.learn.ranker.train import head_aucs, like_threshold
from recsys_tools.world.read.items import ItemInfo
from recsys_tools.world.read.log import InteractionLog, ReadCounts

WIDTH = 12
FAST = replace(DCN, epochs=12, patience=3)
NO_CODES = np.zeros(0, np.int64)
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def _planted(n: int, seed: int) -> Arrays:
    """Column 0 tells an interaction; column 1 tells, among interactions, a like; the
    product of columns 2 and 3 also tells an interaction (a crossing)."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n, WIDTH)).astype(np.float32)
    interact_logit = 2.0 * rows[:, 0] + 1.5 * rows[:, 2] * rows[:, 3] - 1.0
    interacted = (rng.random(n) < 1 / (1 + np.exp(-interact_logit))).astype(np.int8)
    liked = interacted * (rng.random(n) < 1 / (1 + np.exp(-3.0 * rows[:, 1]))).astype(np.int8)
    return rows, interacted, liked


@pytest.fixture(scope="module")
def planted() -> Arrays:
    return _planted(12_000, seed=1)


def test_each_head_learns_its_own_label(planted: Arrays) -> None:
    rows, interacted, liked = planted
    net = fit_net(rows[:10_000], interacted[:10_000], liked[:10_000], FAST, seed=2)
    test = slice(10_000, None)
    aucs = head_aucs(net, rows[test], interacted[test], liked[test])
    assert (aucs["interact"] or 0) > 0.75, aucs
    assert (aucs["like"] or 0) > 0.75, aucs
    heads = net.head_probabilities(rows[test])
    positive = interacted[test] == 1
    # Each head reads its own column: the like head says nothing of interacting, and the
    # interact head nothing of liking among the interactions.
    assert abs(auc(interacted[test], heads[:, 1]) - 0.5) < 0.1
    assert abs(auc(liked[test][positive], heads[positive, 0]) - 0.5) < 0.1


def test_the_score_is_the_interaction_valued_by_the_like(planted: Arrays) -> None:
    rows, interacted, liked = planted
    net = fit_net(rows[:4000], interacted[:4000], liked[:4000], replace(FAST, epochs=2), seed=2)
    heads = net.head_probabilities(rows[:100])
    w = net.shape.like_weight
    # A log-odds: the interact head's odds, multiplied by the like value.
    odds = heads[:, 0] / (1 - heads[:, 0]) * ((1 - w) + w * heads[:, 1])
    np.testing.assert_allclose(net.scores(rows[:100]), np.log(odds), rtol=1e-6)
    # Without a like label the like head is left out of the score: its log-odds alone.
    alone = fit_net(rows[:4000], interacted[:4000], None, replace(FAST, epochs=2), seed=2)
    assert alone.shape.like_weight == 0.0
    p = alone.head_probabilities(rows[:100])[:, 0]
    np.testing.assert_allclose(alone.scores(rows[:100]), np.log(p / (1 - p)), rtol=1e-6)


@pytest.mark.parametrize("shape", [MLP, DCN], ids=["mlp", "dcn"])
def test_the_exported_graph_computes_the_trained_score(planted: Arrays, shape: NetShape) -> None:
    rows, interacted, liked = planted
    net = fit_net(rows[:3000], interacted[:3000], liked[:3000], replace(shape, epochs=2), seed=3)
    session = ort.InferenceSession(
        export_net(net, "features", "score", WIDTH), providers=["CPUExecutionProvider"]
    )
    assert [o.name for o in session.get_outputs()] == ["score", "heads"]
    out, heads = session.run(None, {"features": rows[:257]})
    assert out.shape == (257, 1)
    np.testing.assert_allclose(out[:, 0], net.scores(rows[:257]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(heads, net.head_probabilities(rows[:257]), rtol=1e-4, atol=1e-6)
    layers = (*net.cross, *net.deep, net.heads)
    assert net.flops_per_row == sum(2 * layer.weight.size for layer in layers)
    assert len(net.cross) == shape.cross_layers


def test_the_build_keeps_the_shape_with_the_lower_validation_loss(
    planted: Arrays,
) -> None:
    rows, interacted, liked = planted
    shapes = (replace(MLP, epochs=3), replace(DCN, epochs=3))
    net = fit_best(rows[:6000], interacted[:6000], liked[:6000], shapes, seed=4)
    assert set(net.considered) == {"mlp", "dcn"}
    assert net.validation_loss == min(net.considered.values())
    assert net.considered[net.shape.kind] == net.validation_loss


def test_with_rows_of_other_users_the_build_keeps_the_better_auc_there(planted: Arrays) -> None:
    rows, interacted, liked = planted
    shapes = (replace(MLP, epochs=3), replace(DCN, epochs=3))
    check = (rows[8000:], interacted[8000:])
    net = fit_best(rows[:6000], interacted[:6000], liked[:6000], shapes, seed=4, check=check)
    assert set(net.considered) == {"mlp", "dcn"}
    assert net.considered[net.shape.kind] == max(net.considered.values())
    assert net.considered[net.shape.kind] == pytest.approx(
        auc(check[1], net.scores(check[0])), abs=1e-4
    )
    # Rows of one class tell nothing: the validation loss decides.
    flat = (rows[8000:], np.ones(len(rows) - 8000, np.int8))
    fallback = fit_best(rows[:6000], interacted[:6000], liked[:6000], shapes, seed=4, check=flat)
    assert fallback.validation_loss == min(fallback.considered.values())


def _log(weights: list[float] | None, positive: list[bool]) -> InteractionLog:
    n = len(positive)
    return InteractionLog(
        source="t",
        user_ids=np.array(["u"]),
        items=ItemInfo(
            np.array([f"i{k}" for k in range(n)]), (), np.zeros(n + 1, np.int64), NO_CODES, None
        ),
        user=np.zeros(n, np.int64),
        item=np.arange(n, dtype=np.int64),
        time=np.arange(n, dtype=np.int64),
        weight=None if weights is None else np.array(weights, np.float32),
        positive=np.array(positive),
        counts=ReadCounts(n, {}, 0),
    )


def test_a_like_is_a_positive_rated_at_least_the_median() -> None:
    assert like_threshold(_log([2, 3.5, 4, 4.5, 5], [False, True, True, True, True])) == 4.25
    # Most positives at the lowest rating: a like is any rating above it.
    assert like_threshold(_log([4, 4, 4, 5], [True] * 4)) == 5
    # Clicks alone, or every positive alike: no like label.
    assert like_threshold(_log(None, [True, True])) is None
    assert like_threshold(_log([1, 1], [True, True])) is None
