"""The collectors are declared as data (app/core/metrics.py: DECLARED); the class types them."""

from __future__ import annotations

from app.core.metrics import DECLARED, ServiceMetrics


def test_every_declared_collector_is_a_typed_attribute_of_the_metrics() -> None:
    annotated = {n: t for n, t in ServiceMetrics.__annotations__.items() if n != "registry"}
    assert set(annotated) == set(DECLARED)
    metrics = ServiceMetrics()
    for attribute, declared in DECLARED.items():
        assert isinstance(getattr(metrics, attribute), declared.kind)
        assert annotated[attribute] == declared.kind.__name__
