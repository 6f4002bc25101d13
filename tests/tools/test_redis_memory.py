"""recsys doctor's Redis memory verdict: the streams' worst case in bytes against maxmemory."""

from __future__ import annotations

from recsys_tools.doctor.findings import Status
from recsys_tools.doctor.redis_memory import StreamBudget, judge

GIB = 2**30
# 4 partitions x 1,000 entries x (128 KiB + overhead): about half a GiB at worst.
BUDGET = StreamBudget(partitions=4, entries_per_stream=1000, largest_entry_bytes=128 * 1024)


def _info(used: float, most: float, policy: str = "noeviction") -> dict[str, object]:
    return {"used_memory": int(used), "maxmemory": int(most), "maxmemory_policy": policy}


def test_room_for_the_streams_worst_case_is_ok() -> None:
    verdict = judge(_info(1 * GIB, 8 * GIB), BUDGET, streams_now=0)
    assert verdict.status is Status.OK
    assert "4 partitions x 1,000 entries x 131,072 bytes" in verdict.finding


def test_a_worst_case_past_maxmemory_warns_and_names_the_settings() -> None:
    verdict = judge(_info(1.6 * GIB, 2 * GIB), BUDGET, streams_now=0)
    assert verdict.status is Status.WARN
    assert verdict.remedy is not None
    assert "RECSYS_EVENT_STREAM_MAX" in verdict.remedy
    # What the streams hold already is counted once, not on top of their worst case.
    assert judge(_info(1.6 * GIB, 2 * GIB), BUDGET, streams_now=GIB).status is Status.OK


def test_no_limit_or_an_evicting_policy_or_nearly_full_is_said() -> None:
    assert judge(_info(GIB, 0), BUDGET, 0).status is Status.WARN
    assert judge(_info(GIB, 8 * GIB, "allkeys-lru"), BUDGET, 0).status is Status.FAIL
    assert judge(_info(7 * GIB, 8 * GIB), BUDGET, 0).status is Status.FAIL
