"""Whether Redis has room for what the service keeps there before its writes stop.

The deployment runs Redis with `noeviction`: at maxmemory every write is refused, events
stop applying and appends get 503s. The event streams are capped by entry count, and an
entry is one posted batch's share of a partition, so their budget in bytes is the count
times the largest valid entry (a full batch, bounded by the body limit). The users' state,
the items and the answer notes come on top of what Redis uses now.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from recsys_tools.doctor.findings import CheckOutcome, fail, ok, warn

# Redis's own cost per stream entry beyond its fields (listpack and radix tree), generously.
ENTRY_OVERHEAD_BYTES = 64
# Past this share of maxmemory in use, the alert RecsysRedisMemoryHigh fires.
HIGH_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class StreamBudget:
    partitions: int
    entries_per_stream: int
    largest_entry_bytes: int  # the body limit: a compact entry is never larger than its body

    @property
    def worst_case_bytes(self) -> int:
        per_entry = self.largest_entry_bytes + ENTRY_OVERHEAD_BYTES
        return self.partitions * self.entries_per_stream * per_entry


def _mib(size: float) -> str:
    return f"{size / 2**20:,.0f} MiB"


def judge(info: dict[str, Any], budget: StreamBudget, streams_now: int) -> CheckOutcome:
    """The verdict from INFO memory, the streams' worst case, and what they hold now."""
    used = int(info.get("used_memory", 0))
    most = int(info.get("maxmemory", 0))
    policy = str(info.get("maxmemory_policy", "?"))
    worst = budget.worst_case_bytes
    said = (
        f"Redis uses {_mib(used)} of {_mib(most) if most else 'no limit'} ({policy}); the "
        f"event streams may hold up to {_mib(worst)} ({budget.partitions} partitions x "
        f"{budget.entries_per_stream:,} entries x {budget.largest_entry_bytes:,} bytes at most), "
        f"{_mib(streams_now)} now"
    )
    if not most:
        return warn(
            said,
            "set maxmemory in redis.conf (deploy/quadlet/redis.conf) below the host's memory, "
            "or Redis grows until the kernel kills it",
        )
    if policy != "noeviction":
        return fail(
            said,
            "set maxmemory-policy noeviction: evicting would drop users' features and "
            "unapplied events without a word",
        )
    if used >= HIGH_SHARE * most:
        return fail(said, "raise maxmemory or free room before writes stop (docs/realtime.md)")
    if used - streams_now + worst > most:
        return warn(
            said,
            "a consumer stopped long enough to fill the streams would take Redis to maxmemory: "
            "lower RECSYS_EVENT_STREAM_MAX (or RECSYS_MAX_BODY_BYTES), or raise maxmemory",
        )
    return ok(said)


async def measure(client: Any, stream_keys: list[str]) -> tuple[dict[str, Any], int]:
    info: dict[str, Any] = await client.info("memory")
    sizes = await asyncio.gather(*(client.memory_usage(key) for key in stream_keys))
    return info, sum(int(size or 0) for size in sizes)
