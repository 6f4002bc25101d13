import logging

import pytest

from app.core.throttled_log import ThrottledLog


def test_one_line_per_key_and_interval_carrying_the_suppressed_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = ThrottledLog(logging.getLogger("t"), interval_s=5.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        assert log.warning("a", "redis %s", "down")
        assert not log.warning("a", "redis %s", "down")
        assert not log.warning("a", "redis %s", "down")
        assert log.warning("b", "triton %s", "down")
        now[0] = 5.0
        assert log.warning("a", "redis %s", "back?")
    assert [r.getMessage() for r in caplog.records] == [
        "redis down",
        "triton down",
        "redis back? (and 2 more like it since the last line)",
    ]
