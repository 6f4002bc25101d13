from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from app.core.errors import ConfigError
from app.pipeline.selectors.boost import Boost, adjusted_scores, log_factors
from app.pipeline.selectors.category_cap import rank_within_group
from app.pipeline.selectors.rerank import rerank
from app.pipeline.selectors.selecting import Exploring
from app.release.rules import (
    NEUTRAL_RULES,
    BoostRule,
    DiversityRule,
    ObjectivesRule,
    RerankRules,
    load_rules,
)
from app.world.schema import ScoreScale

NO_RULES = RerankRules()
CAP_ONE = RerankRules(diversity=DiversityRule(max_per_category=1))


def _rerank(
    scores: list[float],
    categories: list[int] | None = None,
    age_days: list[float] | None = None,
    rules: RerankRules = NO_RULES,
    n_items: int = 10,
    tie_keys: list[int] | None = None,
    likes: list[float] | None = None,
    scale: ScoreScale = "probability",
) -> tuple[list[int], list[float]]:
    n = len(scores)
    selection = rerank(
        tie_keys=np.array(tie_keys if tie_keys is not None else range(n), dtype=np.int64),
        scores=np.array(scores, dtype=np.float32),
        categories=np.array(categories or [0] * n, dtype=np.int64),
        age_days=np.array(age_days or [100.0] * n, dtype=np.float32),
        rules=rules,
        n_items=n_items,
        likes=None if likes is None else np.array(likes, dtype=np.float32),
        scale=scale,
    )
    return selection.positions.tolist(), selection.scores.tolist()


def test_orders_by_score_and_truncates() -> None:
    positions, scores = _rerank([0.1, 0.9, 0.5, 0.7], n_items=3)
    assert positions == [1, 3, 2]
    assert scores == pytest.approx([0.9, 0.7, 0.5])


def test_ties_break_on_tie_key_whatever_the_input_order() -> None:
    positions, _ = _rerank([0.5, 0.5, 0.5], tie_keys=[30, 10, 20])
    assert positions == [1, 2, 0]


def test_unscored_candidates_follow_the_scored_ones_in_input_order() -> None:
    nan = float("nan")
    positions, scores = _rerank([nan, 0.2, nan, 0.9, nan], n_items=5, tie_keys=[9, 8, 7, 6, 5])
    assert positions == [3, 1, 0, 2, 4]
    assert scores[:2] == pytest.approx([0.9, 0.2])
    assert all(np.isnan(scores[2:]))


def test_the_cap_applies_to_unscored_candidates_too() -> None:
    nan = float("nan")
    positions, _ = _rerank([0.5, nan, nan, nan], categories=[1, 1, 2, 2], n_items=3, rules=CAP_ONE)
    assert positions == [0, 2, 1]


def test_diversity_cap_then_backfill_in_score_order() -> None:
    rules = RerankRules(diversity=DiversityRule(max_per_category=1))
    positions, _ = _rerank(
        [0.9, 0.8, 0.7, 0.6, 0.5], categories=[1, 1, 2, 2, 3], rules=rules, n_items=4
    )
    # one per category first (0, 2, 4), then the best capped-out item (1)
    assert positions == [0, 2, 4, 1]


def test_diversity_cap_of_two() -> None:
    rules = RerankRules(diversity=DiversityRule(max_per_category=2))
    positions, _ = _rerank([0.9, 0.8, 0.7, 0.6], categories=[5, 5, 5, 6], rules=rules, n_items=3)
    assert positions == [0, 1, 3]


def test_fresh_items_are_boosted_past_older_ones() -> None:
    rules = RerankRules(boost=(BoostRule(name="fresh", max_age_days=7, multiplier=2.0),))
    positions, scores = _rerank([0.5, 0.3], age_days=[30.0, 1.0], rules=rules)
    assert positions == [1, 0]
    assert scores == pytest.approx([0.6, 0.5])


def test_boosts_compound() -> None:
    rules = RerankRules(
        boost=(
            BoostRule(name="week", max_age_days=7, multiplier=2.0),
            BoostRule(name="day", max_age_days=1, multiplier=3.0),
        )
    )
    ones, ages = np.array([1.0, 1.0, 1.0], np.float32), np.array([0.5, 3.0, 10.0], np.float32)
    factors = log_factors(None, ages, rules)
    np.testing.assert_allclose(adjusted_scores(ones, factors, "probability"), [6.0, 2.0, 1.0])
    # A log-odds score gains the log of the product: its odds are multiplied.
    np.testing.assert_allclose(
        adjusted_scores(ones, factors, "log_odds"), 1.0 + np.log([6.0, 2.0, 1.0]), rtol=1e-6
    )


def test_a_boost_raises_a_negative_log_odds_score() -> None:
    # Multiplying a log-odds of -2 by 2 would sink the item: the odds are what is multiplied.
    rules = RerankRules(boost=(BoostRule(name="fresh", max_age_days=7, multiplier=2.0),))
    positions, scores = _rerank([-2.0, -1.5], age_days=[1.0, 30.0], rules=rules, scale="log_odds")
    assert positions == [0, 1]
    assert scores == pytest.approx([-2.0 + np.log(2.0), -1.5])


def test_the_like_weight_adds_its_log_to_a_log_odds_score() -> None:
    full = RerankRules(objectives=ObjectivesRule(like=1.0))
    positions, values = _rerank(
        [3.0, 2.5, -1.0], likes=[0.1, 0.9, 0.0], rules=full, scale="log_odds"
    )
    assert positions == [1, 0, 2]
    assert values[:2] == pytest.approx([2.5 + np.log(0.9), 3.0 + np.log(0.1)])
    # A like head of exactly 0 sinks the item far, never to -inf or NaN.
    assert np.isfinite(values[2])
    assert values[2] < -80


def test_log_odds_scores_far_past_a_sigmoids_range_keep_their_order() -> None:
    scores = [30.0, 29.5, 31.0, 18.0]
    positions, values = _rerank(scores, scale="log_odds")
    assert positions == [2, 0, 1, 3]
    assert values == pytest.approx([31.0, 30.0, 29.5, 18.0])


def test_rank_within_group() -> None:
    ranks = rank_within_group(np.array([3, 1, 3, 3, 1, 2], dtype=np.int64))
    assert ranks.tolist() == [0, 0, 1, 2, 1, 0]


def test_empty_candidates() -> None:
    assert _rerank([]) == ([], [])


def test_load_rules_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[diversity]\nmax_per_category = 2\n[[boost]]\nname = "new"\nmax_age_days = 3\n'
        'multiplier = 1.5\n[block]\nitem_ids = ["i1"]\n'
    )
    rules = load_rules(path)
    assert rules.diversity.max_per_category == 2
    assert rules.boost[0].multiplier == 1.5
    assert rules.block.item_ids == frozenset({"i1"})


def test_packaged_rules_load() -> None:
    # Rules that change nothing the model decided, but a lift for fresh items (a publish
    # time the model's features cannot see until users have found the item).
    rules = load_rules()
    assert rules.diversity.max_per_category == 0
    assert rules.diversity.relevance == 1.0
    assert rules.objectives.like == 0.0
    assert rules.objectives == ObjectivesRule()  # the file says what the model's defaults are
    assert [boost.name for boost in rules.boost] == ["fresh"]


def test_the_like_weight_values_each_score_by_its_like_head() -> None:
    scores, likes = [0.5, 0.4, 0.3], [0.1, 0.5, 1.0]
    # Off: the model's score alone, whatever the heads say.
    assert _rerank(scores, likes=likes)[0] == [0, 1, 2]
    # All the weight on likes: 0.05, 0.2, 0.3.
    full = RerankRules(objectives=ObjectivesRule(like=1.0))
    positions, values = _rerank(scores, likes=likes, rules=full)
    assert positions == [2, 1, 0]
    assert values == pytest.approx([0.3, 0.2, 0.05])
    # Half: 0.275, 0.3, 0.3 (ties by key).
    half = RerankRules(objectives=ObjectivesRule(like=0.5))
    assert _rerank(scores, likes=likes, rules=half)[0] == [1, 2, 0]
    # A model without heads, or a candidate without its like, keeps its score.
    assert _rerank(scores, rules=full)[0] == [0, 1, 2]
    nan = float("nan")
    assert _rerank(scores, likes=[nan, 0.5, 1.0], rules=full)[1] == pytest.approx([0.5, 0.3, 0.2])


@pytest.mark.parametrize(
    "text",
    [
        "[diversity]\nmax_per_category = -1\n",
        "[diversity]\nmax_per_categroy = 1\n",
        "[objectives]\nlike = 1.5\n",
        "[[boost]]\nname = 'x'\nmax_age_days = 1\nmultiplier = 0\n",
        "not toml at all [",
    ],
)
def test_invalid_rules_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="rules file"):
        load_rules(path)


def _sorted_in_full(
    tie_keys: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float32],
    categories: npt.NDArray[np.int64],
    cap: int,
    n: int,
) -> list[int]:
    """The definition, sorting every candidate: what the head-only shortcut must equal."""
    scored = [i for i in range(len(scores)) if not np.isnan(scores[i])]
    scored.sort(key=lambda i: (-float(scores[i]), int(tie_keys[i])))
    order = scored + [i for i in range(len(scores)) if np.isnan(scores[i])]
    if cap:
        taken: dict[int, int] = {}
        first: list[int] = []
        rest: list[int] = []
        for i in order:
            taken[int(categories[i])] = taken.get(int(categories[i]), 0) + 1
            (first if taken[int(categories[i])] <= cap else rest).append(i)
        order = first + rest
    return order[:n]


@pytest.mark.parametrize("seed", range(40))
def test_the_selectors_equal_a_plain_full_sort_and_cap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    # Coarse scores make ties common; few categories make the cap bite.
    scores = (rng.integers(0, 20, size) / 20).astype(np.float32)
    scores[rng.random(size) < 0.1] = np.nan
    categories = rng.integers(0, int(rng.integers(1, 8)), size).astype(np.int64)
    tie_keys = rng.permutation(size * 3)[:size].astype(np.int64)
    cap = int(rng.integers(0, 4))
    n_items = int(rng.integers(1, 30))
    rules = RerankRules(diversity=DiversityRule(max_per_category=cap))
    selection = rerank(
        tie_keys, scores, categories, np.full(size, 100.0, np.float32), rules, n_items
    )
    assert selection.positions.tolist() == _sorted_in_full(
        tie_keys, scores, categories, cap, n_items
    )


def _mmr(scores: list[float], vectors: list[list[float]], relevance: float) -> list[int]:
    n = len(scores)
    selection = rerank(
        tie_keys=np.arange(n, dtype=np.int64),
        scores=np.array(scores, dtype=np.float32),
        categories=np.zeros(n, dtype=np.int64),
        age_days=np.full(n, 100.0, dtype=np.float32),
        rules=RerankRules(diversity=DiversityRule(relevance=relevance)),
        n_items=2,
        vectors=np.array(vectors, dtype=np.float32),
    )
    chosen: list[int] = selection.positions.tolist()
    return chosen


def test_marginal_relevance_passes_over_a_near_copy_of_what_was_chosen() -> None:
    scores = [0.9, 0.85, 0.6, 0.1]
    vectors = [[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [-1.0, 0.0]]
    # Score alone: the near copy second. Weighing likeness: the unlike item instead.
    assert _mmr(scores, vectors, 1.0) == [0, 1]
    assert _mmr(scores, vectors, 0.5) == [0, 2]
    # Leaning on score, a small loss of likeness is not worth a large loss of score.
    assert _mmr(scores, vectors, 0.95) == [0, 1]


def test_marginal_relevance_is_off_without_vectors_and_at_one() -> None:
    rules = RerankRules(diversity=DiversityRule(relevance=0.5))
    selection = rerank(
        tie_keys=np.arange(3, dtype=np.int64),
        scores=np.array([0.9, 0.8, 0.1], dtype=np.float32),
        categories=np.zeros(3, dtype=np.int64),
        age_days=np.full(3, 100.0, dtype=np.float32),
        rules=rules,
        n_items=2,
    )
    assert selection.positions.tolist() == [0, 1]
    with pytest.raises(ValueError, match="relevance"):
        DiversityRule(relevance=0.0)


def test_each_item_left_out_is_named_by_the_selector_that_left_it_out() -> None:
    # Cap 1 and diversity both on. Item 2 shares item 0's category: over the cap. Item 1,
    # of a category of its own, is a near copy of item 0: diversity passes it over. (Diversity
    # chooses among what the cap kept: it never serves an item over the cap.)
    scores = [0.9, 0.85, 0.8, 0.7, 0.6, 0.5]
    categories = [1, 2, 1, 1, 3, 4]
    vectors = [[1.0, 0.0], [0.99, 0.05], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.2], [0.0, -1.0]]
    rules = RerankRules(diversity=DiversityRule(max_per_category=1, relevance=0.5))
    selection = rerank(
        tie_keys=np.arange(6, dtype=np.int64),
        scores=np.array(scores, dtype=np.float32),
        categories=np.array(categories, dtype=np.int64),
        age_days=np.full(6, 100.0, dtype=np.float32),
        rules=rules,
        n_items=3,
        vectors=np.array(vectors, dtype=np.float32),
        explain=True,
    )
    served = selection.positions.tolist()
    assert 2 not in served
    assert 1 not in served
    assert "category cap" in selection.left_out[2]
    assert "diversity" in selection.left_out[1]
    # Served items carry no reason; nothing is explained unless asked.
    assert not set(served) & set(selection.left_out)
    plain = rerank(
        np.arange(6, dtype=np.int64),
        np.array(scores, dtype=np.float32),
        np.array(categories, dtype=np.int64),
        np.full(6, 100.0, dtype=np.float32),
        rules,
        3,
        np.array(vectors, dtype=np.float32),
    )
    assert plain.left_out == {}
    assert plain.positions.tolist() == served


def test_a_boost_that_passes_an_item_is_named_for_it() -> None:
    rules = RerankRules(boost=(BoostRule(name="fresh", max_age_days=7, multiplier=4.0),))
    selection = rerank(
        tie_keys=np.arange(3, dtype=np.int64),
        scores=np.array([0.5, 0.4, 0.3], dtype=np.float32),
        categories=np.zeros(3, dtype=np.int64),
        age_days=np.array([30.0, 30.0, 1.0], dtype=np.float32),
        rules=rules,
        n_items=2,
        scale="probability",
        explain=True,
    )
    assert selection.positions.tolist() == [2, 0]
    assert selection.left_out == {1: Boost.reason}


def _neutral_order(rules: RerankRules) -> tuple[list[int], list[int]]:
    # Ties, one crowded category, fresh items, likes, an item page's similarities and
    # newcomers never shown: everything a rule could act on is there.
    rng = np.random.default_rng(5)
    n = 30
    scores = rng.choice([0.2, 0.5, 0.7, 0.9], size=n).astype(np.float32)
    keys = rng.permutation(n).astype(np.int64)
    selection = rerank(
        tie_keys=keys,
        scores=scores,
        categories=np.zeros(n, dtype=np.int64),
        age_days=np.full(n, 0.5, dtype=np.float32),
        rules=rules,
        n_items=12,
        likes=rng.random(n).astype(np.float32),
        scale="probability",
        with_viewed=rng.random(n).astype(np.float32),
        exploring=Exploring(
            newcomer=rng.random(n) < 0.5,
            shown=np.zeros(n),
            chosen=np.zeros(n),
            rule=rules.explore,
            draw=np.random.default_rng(1),
        ),
    )
    expected = sorted(range(n), key=lambda k: (-float(scores[k]), int(keys[k])))[:12]
    return selection.positions.tolist(), expected


def test_neutral_rules_keep_the_models_order_whatever_the_items() -> None:
    positions, expected = _neutral_order(NEUTRAL_RULES)
    assert positions == expected
    # The defaults are not neutral where an item page or a newcomer is in play.
    positions, expected = _neutral_order(RerankRules())
    assert positions != expected
