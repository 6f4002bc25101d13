from dataclasses import replace

import numpy as np

from app.release.artifacts import ArtifactsRef, ServingArtifacts, serving_artifacts
from app.release.catalog import Catalog
from app.release.keyspace import KeySpace
from app.release.plan import ModelRouting, Routed
from app.release.rules import BlockRule, DiversityRule, RerankRules
from app.world.schema import ModelSignature
from tests.unit.tiny_schema import tiny_schema


def _artifacts(rules: RerankRules) -> ServingArtifacts:
    catalog = Catalog(
        item_ids=np.array(["a", "b", "c", "d"]),
        categories=np.zeros(4, dtype=np.int64),
        published_at=np.zeros(4, dtype=np.int64),
        popular_order=np.array([2, 0, 3, 1], dtype=np.int64),
        default_user_blob=np.zeros(3, dtype=np.float32),
        index=None,
    )
    model = ModelSignature("m", "1", "features", "FP32", (-1, 15), "score", "FP32", 8)
    routing = ModelRouting(Routed("", model))
    return serving_artifacts(tiny_schema(), catalog, rules, routing, KeySpace("rs"))


def test_blocked_items_are_resolved_once_and_left_out_of_popular() -> None:
    artifacts = _artifacts(RerankRules(block=BlockRule(item_ids=frozenset({"c", "zzz"}))))
    assert artifacts.blocked.tolist() == [False, False, True, False]
    assert artifacts.popular.tolist() == [0, 3, 1]
    assert artifacts.item_keys.tolist() == [b"rs:i:a", b"rs:i:b", b"rs:i:c", b"rs:i:d"]


def test_without_a_block_list_nothing_is_blocked() -> None:
    artifacts = _artifacts(RerankRules())
    assert not artifacts.blocked.any()
    assert artifacts.popular.tolist() == [2, 0, 3, 1]


def test_a_snapshot_taken_before_a_swap_keeps_the_old_artifacts() -> None:
    old = _artifacts(RerankRules())
    new = replace(old, rules=RerankRules(diversity=DiversityRule(max_per_category=1)))
    ref = ArtifactsRef(old)
    snapshot = ref.current  # what a request in flight holds

    assert ref.swap(new) is old
    assert ref.current is new
    assert snapshot.rules.diversity.max_per_category == 0
