"""What every run reports: the Spark engine's tests by outcome, so a run without them shows."""

from __future__ import annotations

from collections import Counter

import pytest

# A test's worst outcome counts: a failed call, or an error in its teardown, beats the
# passed setup reported before it.
OUTCOMES = ("failed", "error", "skipped", "passed")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    seen: dict[str, str] = {}
    for outcome in OUTCOMES:
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = str(getattr(report, "nodeid", ""))
            if "spark" in nodeid.lower():
                seen.setdefault(nodeid, outcome)
    if not seen:
        return
    counts = Counter(seen.values())
    said = ", ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES if counts[outcome])
    terminalreporter.write_line(f"Spark engine tests: {said}")
