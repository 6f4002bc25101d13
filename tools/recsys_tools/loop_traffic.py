"""The loop demo's traffic, sent as a frontend sends it: a past week's ratings posted to
/events, then today's users asking before each rating and clicking what was shown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

EVENT_BATCH = 500
RatingRow = tuple[str, str, float, int]  # user, item, rating, seconds since the epoch


async def post_week(url: str, rows: list[RatingRow]) -> int:
    """The week's ratings as the frontend posts them, stamped when they happened."""
    posted = 0
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        for start in range(0, len(rows), EVENT_BATCH):
            batch = [
                {
                    "event_id": f"week-{start + n}",
                    "user_id": user,
                    "item_id": item,
                    "type": "rating",
                    "value": rating,
                    "ts": ts * 1000,
                }
                for n, (user, item, rating, ts) in enumerate(rows[start : start + EVENT_BATCH])
            ]
            response = await _posted(client, batch)
            posted += int(response.json()["accepted"])
    return posted


async def _posted(client: httpx.AsyncClient, events: list[dict[str, Any]]) -> httpx.Response:
    """POST /events as a well-behaved sender: over its quota (429), it waits as told."""
    while True:
        response = await client.post("/events", json={"events": events})
        if response.status_code != 429:
            response.raise_for_status()
            return response
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))


@dataclass(slots=True)
class Day:
    answers: dict[str, int] = field(default_factory=dict)  # by world role
    clicks: dict[str, int] = field(default_factory=dict)
    failed: int = 0


async def ask_and_click(url: str, rows: list[RatingRow], num_items: int, callers: int = 4) -> Day:
    """Each user asks before each rating and clicks the item where it was shown; users are
    spread over `callers` concurrent callers, each user's rows in their order."""
    day = Day()
    by_user: dict[str, list[RatingRow]] = {}
    for row in rows:
        by_user.setdefault(row[0], []).append(row)
    users = sorted(by_user)

    async def caller(client: httpx.AsyncClient, mine: list[str]) -> None:
        for user in mine:
            for n, (_, item, rating, _) in enumerate(by_user[user]):
                answer = await client.post(
                    "/recommend", json={"user_id": user, "num_items": num_items}
                )
                events: list[dict[str, Any]] = [
                    {
                        "event_id": f"today-{user}-{n}",
                        "user_id": user,
                        "item_id": item,
                        "type": "rating",
                        "value": rating,
                    }
                ]
                body = answer.json()
                if answer.status_code != 200 or body["degraded"]:
                    day.failed += 1
                else:
                    role = body["world"]["role"]
                    day.answers[role] = day.answers.get(role, 0) + 1
                    if item in [each["item_id"] for each in body["items"]]:
                        day.clicks[role] = day.clicks.get(role, 0) + 1
                        events.append(
                            {
                                "event_id": f"today-{user}-{n}-click",
                                "user_id": user,
                                "item_id": item,
                                "type": "click",
                                "answer_id": body["answer_id"],
                            }
                        )
                await _posted(client, events)

    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        await asyncio.gather(*(caller(client, users[k::callers]) for k in range(callers)))
    return day
