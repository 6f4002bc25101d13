"""The order model as served: its state stepped from the latest positives, its scores, the
file it is read from, and the signal pre-rank and the packer read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import ConfigError
from app.pipeline.signals import ORDER, prerank_scores, prerank_signals
from app.world.layout import ORDER_FILE, PRERANK_FILE
from app.world.neighbours import NOWHERE
from app.world.order import ARRAYS, NO_TASTE, OrderModel, load_order, save_order, taste_of
from app.world.prerank import PrerankWeights, load_prerank

ITEMS, WIDTH, HIDDEN, WINDOW = 12, 5, 4, 6


def _model(seed: int = 3) -> OrderModel:
    rng = np.random.default_rng(seed)

    def drawn(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.7, shape).astype(np.float32)

    return OrderModel(
        inputs=drawn(ITEMS, WIDTH),
        weight_ih=drawn(3 * HIDDEN, WIDTH),
        weight_hh=drawn(3 * HIDDEN, HIDDEN),
        bias_ih=drawn(3 * HIDDEN),
        bias_hh=drawn(3 * HIDDEN),
        outputs=drawn(ITEMS, HIDDEN),
        output_bias=drawn(ITEMS),
        window=WINDOW,
    )


def _stepped(model: OrderModel, recent: list[int]) -> np.ndarray:
    """The GRU's equations written out one gate at a time (PyTorch's layout: r, z, n)."""
    h = np.zeros(HIDDEN, np.float64)
    w_ih, w_hh = model.weight_ih.astype(np.float64), model.weight_hh.astype(np.float64)
    b_ih, b_hh = model.bias_ih.astype(np.float64), model.bias_hh.astype(np.float64)

    def gate(k: int, x: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(k * HIDDEN, (k + 1) * HIDDEN)
        return w_ih[rows] @ x + b_ih[rows], w_hh[rows] @ h + b_hh[rows]

    for item in recent:
        x = model.inputs[item].astype(np.float64)
        r = 1 / (1 + np.exp(-sum(gate(0, x, h))))
        z = 1 / (1 + np.exp(-sum(gate(1, x, h))))
        n_in, n_h = gate(2, x, h)
        n = np.tanh(n_in + r * n_h)
        h = (1 - z) * n + z * h
    return h


def test_the_state_is_the_grus_stepped_through_the_latest_positives_in_order() -> None:
    model = _model()
    recent = np.array([4, 1, 7, 1], np.int64)
    np.testing.assert_allclose(model.state(recent), _stepped(model, [4, 1, 7, 1]), atol=1e-5)
    # The order is the signal: the same items read the other way round end elsewhere.
    assert not np.allclose(model.state(recent), model.state(recent[::-1]), atol=1e-3)


def test_each_candidate_scores_its_output_against_the_state() -> None:
    model = _model()
    recent = np.array([2, 9], np.int64)
    taste = model.taste(recent)
    positions = np.array([0, 5, 11], np.int64)
    expected = model.outputs[positions] @ model.state(recent) + model.output_bias[positions]
    np.testing.assert_allclose(taste.scores(positions), expected, atol=1e-6)


def test_items_the_model_never_saw_are_passed_over_and_score_zero() -> None:
    model = _model()
    # An item added while serving sits past the world's: not a step, and no score of its own.
    with_added = np.array([3, ITEMS + 2, 6], np.int64)
    np.testing.assert_array_equal(model.state(with_added), model.state(np.array([3, 6], np.int64)))
    scores = model.taste(with_added).scores(np.array([ITEMS, ITEMS + 5, 1], np.int64))
    assert scores[0] == scores[1] == 0.0
    assert scores[2] != 0.0


def test_a_user_without_positives_the_model_knows_has_no_taste() -> None:
    model = _model()
    assert model.taste(np.empty(0, np.int64)) is NO_TASTE
    assert taste_of(None, np.array([1, 2], np.int64)) is NO_TASTE
    np.testing.assert_array_equal(NO_TASTE.scores(np.arange(ITEMS)), 0.0)
    # Only items added while serving: no state the model learnt from, so no score at all
    # (a zero state would rank every item by its bias alone).
    assert model.taste(np.array([ITEMS + 1, ITEMS + 3], np.int64)) is NO_TASTE


def test_the_model_reads_as_many_of_the_latest_as_it_learnt_to() -> None:
    model = _model()
    longer = np.arange(WINDOW + 4, dtype=np.int64) % ITEMS
    # The service's list may be longer (RECSYS_RECENT_ITEMS, an item page's viewed item).
    np.testing.assert_array_equal(model.state(longer), model.state(longer[-WINDOW:]))
    np.testing.assert_allclose(
        model.state(longer), _stepped(model, longer[-WINDOW:].tolist()), atol=1e-5
    )
    # The window counts the items the model knows: an added one does not push one out.
    added = np.append(longer, np.int64(ITEMS + 7))
    np.testing.assert_array_equal(model.state(added), model.state(longer))


def test_the_order_signal_is_pre_ranks_and_the_packers_column() -> None:
    model = _model()
    vectors = np.random.default_rng(1).normal(size=(ITEMS, 2)).astype(np.float32)
    user = np.array([0.5, -0.2], np.float32)
    recent = np.array([1, 4], np.int64)
    positions = np.array([0, 3, 8, 10], np.int64)
    taste = model.taste(recent)
    for weighed_only in (False, True):
        signals = prerank_signals(
            positions, user, recent, vectors, NOWHERE, 0.9, weighed_only=weighed_only, taste=taste
        )
        np.testing.assert_allclose(signals[:, ORDER], taste.scores(positions), atol=1e-6)
    weights = PrerankWeights(user=1.0, similar=0.0, recent=0.0, order=2.0)
    expected = signals[:, 0] + 2.0 * signals[:, ORDER]
    np.testing.assert_allclose(prerank_scores(signals, weights), expected, atol=1e-5)


def test_the_model_is_read_back_as_written(tmp_path: Path) -> None:
    model = _model()
    save_order(tmp_path, model)
    read = load_order(tmp_path, ITEMS, declared=True)
    assert read is not None
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(read, name), getattr(model, name))


def test_a_world_without_the_model_has_none_unless_its_schema_declares_it(
    tmp_path: Path,
) -> None:
    assert load_order(tmp_path, ITEMS, declared=False) is None
    with pytest.raises(ConfigError, match="declares the order signal"):
        load_order(tmp_path, ITEMS, declared=True)


def _written(tmp_path: Path, **changed: np.ndarray) -> Path:
    model = _model()
    arrays = {name: getattr(model, name) for name in ARRAYS} | {"window": np.int64(WINDOW)}
    np.savez(tmp_path / ORDER_FILE, **(arrays | changed))
    return tmp_path


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"outputs": np.zeros((ITEMS - 1, HIDDEN), np.float32)}, "not a GRU over a catalog"),
        ({"inputs": np.zeros((ITEMS + 1, WIDTH), np.float32)}, "not a GRU over a catalog"),
        ({"weight_hh": np.zeros((3 * HIDDEN, HIDDEN + 1), np.float32)}, "not a GRU"),
        ({"bias_ih": np.zeros(2 * HIDDEN, np.float32)}, "not a GRU"),
        ({"weight_hh": np.zeros((0, 0), np.float32)}, "not a GRU"),
        ({"output_bias": np.zeros(ITEMS, np.int64)}, "not floats"),
        ({"inputs": np.full((ITEMS, WIDTH), np.nan, np.float32)}, "NaN, Inf"),
        ({"output_bias": np.full(ITEMS, 1e300, np.float64)}, "past float32"),
        ({"outputs": np.zeros(ITEMS, np.float32)}, "not a GRU"),
        # Finite, but the gates' products overflow into NaN for every user.
        ({"weight_hh": np.full((3 * HIDDEN, HIDDEN), 3e38, np.float32)}, "no trained GRU"),
        ({"output_bias": np.full(ITEMS, -2e4, np.float32)}, "no trained GRU"),
        ({"window": np.int64(0)}, "window must be"),
        ({"window": np.int64(10**6)}, "window must be"),
        ({"window": np.float64(5.0)}, "window must be"),
        ({"window": np.array([5, 6])}, "window must be"),
    ],
)
def test_a_damaged_model_is_refused_naming_the_file(
    tmp_path: Path, changed: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        load_order(_written(tmp_path, **changed), ITEMS, declared=False)
    assert ORDER_FILE in str(refused.value)


def test_a_model_missing_an_array_or_not_an_archive_is_refused(tmp_path: Path) -> None:
    model = _model()
    np.savez(tmp_path / ORDER_FILE, **{name: getattr(model, name) for name in ARRAYS})
    with pytest.raises(ConfigError, match=ORDER_FILE):  # no window
        load_order(tmp_path, ITEMS, declared=False)
    (tmp_path / ORDER_FILE).write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=ORDER_FILE):
        load_order(tmp_path, ITEMS, declared=False)
    with (tmp_path / ORDER_FILE).open("wb") as handle:
        np.save(handle, np.zeros(3, np.float32))  # one array, not an archive of them
    with pytest.raises(ConfigError, match=ORDER_FILE):
        load_order(tmp_path, ITEMS, declared=False)


def test_pre_rank_weights_written_before_the_order_model_weigh_it_zero(tmp_path: Path) -> None:
    (tmp_path / PRERANK_FILE).write_text(json.dumps({"user": 1.0, "similar": 2.0, "recent": 3.0}))
    assert load_prerank(tmp_path) == PrerankWeights(1.0, 2.0, 3.0, 0.0)
    (tmp_path / PRERANK_FILE).write_text(
        json.dumps({"user": 1, "similar": 2, "recent": 3, "order": 4})
    )
    assert load_prerank(tmp_path).order == 4.0
    weights = '{"user": 1, "similar": 2, "recent": 3, "order": %s}'
    broken = [weights % value for value in ('"x"', '"2.5"', "true", "null", "1e300", "-1e39")]
    broken += [weights % ("1" + "0" * 400), "[1, 2]", '{"user": NaN, "similar": 0, "recent": 0}']
    for broken_file in broken:
        (tmp_path / PRERANK_FILE).write_text(broken_file)
        with pytest.raises(ConfigError, match=PRERANK_FILE):
            load_prerank(tmp_path)
