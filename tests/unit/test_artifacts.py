from dataclasses import replace
from typing import Any

import numpy as np

from app.artifacts import ArtifactsRef, ServingArtifacts
from app.catalog import Catalog
from app.rules import DiversityRule, RerankRules
from app.schema import ModelSignature
from tests.unit.tiny_schema import tiny_schema


def _artifacts(rules: RerankRules) -> ServingArtifacts:
    empty: Any = np.empty(0)
    catalog = Catalog(empty, empty, empty, empty, empty, index=None)
    model = ModelSignature("m", "1", "features", "FP32", (-1, 15), "score", "FP32", 8)
    return ServingArtifacts(tiny_schema(), catalog, rules, model, item_keys=empty)


def test_a_snapshot_taken_before_a_swap_keeps_the_old_artifacts() -> None:
    old = _artifacts(RerankRules())
    new = replace(old, rules=RerankRules(diversity=DiversityRule(max_per_category=1)))
    ref = ArtifactsRef(old)
    snapshot = ref.current  # what a request in flight holds

    assert ref.swap(new) is old
    assert ref.current is new
    assert snapshot.rules.diversity.max_per_category == 0
