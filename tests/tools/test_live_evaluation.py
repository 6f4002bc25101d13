"""`recsys split-log` and `recsys evaluate`: a log cut in time, and answers scored against it."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import httpx
import pytest
from recsys_tools import live_evaluation
from recsys_tools.cli import main
from recsys_tools.live_evaluation import (
    Answers,
    agreement,
    build_claim,
    build_claim_interval,
    inside,
    questions,
    score,
)
from recsys_tools.world.judge import measures
from recsys_tools.world.judge.measures import bootstrap_interval
from recsys_tools.world.read.log import InteractionLog, LogColumns, read_log

from app.core.errors import ConfigError
from app.world.layout import REPORT_FILE

COLUMNS = LogColumns(weight="rating", min_weight=4.0)


def _log(path: Path, rows: list[tuple[str, str, int, float]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["user_id", "item_id", "timestamp", "rating"])
        writer.writerows(rows)
    return path


def test_split_log_cuts_each_users_rows_in_time(tmp_path: Path) -> None:
    rows = [("a", f"i{k}", 100 + k, 5.0) for k in range(10)]
    rows += [("b", f"i{k}", 50 - k, 4.0) for k in range(5)]  # written newest first
    rows += [("c", "i1", 7, 5.0)]  # one row: stays earlier
    source = _log(tmp_path / "all.csv", rows)
    code = main(
        [
            "split-log",
            "--interactions",
            str(source),
            "--weight-col",
            "rating",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    earlier = read_log(tmp_path / "earlier.csv", COLUMNS)
    later = read_log(tmp_path / "later.csv", COLUMNS)

    def by_user(part: InteractionLog) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for user, item in zip(
            part.user_ids[part.user].tolist(), part.items.ids[part.item].tolist(), strict=True
        ):
            found.setdefault(user, []).append(item)
        return found

    assert by_user(earlier) == {
        "a": [f"i{k}" for k in range(8)],
        "b": ["i4", "i3", "i2", "i1"],  # the four oldest
        "c": ["i1"],
    }
    assert by_user(later) == {"a": ["i8", "i9"], "b": ["i0"]}
    assert earlier.weight is not None
    assert set(earlier.weight.tolist()) == {4.0, 5.0}


def test_questions_are_the_later_positives_not_seen_before(tmp_path: Path) -> None:
    earlier = read_log(_log(tmp_path / "e.csv", [("a", "x", 1, 5.0), ("a", "y", 2, 1.0)]), COLUMNS)
    later = read_log(
        _log(
            tmp_path / "l.csv",
            [("a", "y", 3, 5.0), ("a", "z", 4, 4.0), ("a", "w", 5, 2.0), ("b", "x", 6, 1.0)],
        ),
        COLUMNS,
    )
    asked = questions(later, earlier)
    # y was seen (rated low) before; w is not a positive; b liked nothing later.
    assert [(one.user, set(one.relevant), set(one.seen)) for one in asked] == [
        ("a", {"z"}, {"x", "y"})
    ]


def test_score_gives_recall_ndcg_and_seen_items_served(tmp_path: Path) -> None:
    earlier = read_log(_log(tmp_path / "e.csv", [("a", "s", 1, 5.0), ("b", "s", 1, 5.0)]), COLUMNS)
    later = read_log(
        _log(tmp_path / "l.csv", [("a", "x", 3, 5.0), ("a", "y", 4, 5.0), ("b", "z", 5, 5.0)]),
        COLUMNS,
    )
    asked = questions(later, earlier)
    answers = Answers(lists={"a": ["y", "q", "s"], "b": ["q"]}, failed=1)
    report = score(asked, answers, k=3)
    assert report["users"] == 2
    # a: one of two found (recall 1/2), at rank 1; b: none.
    assert report["recall@3"] == pytest.approx(0.25)
    assert report["ndcg@3"] == pytest.approx((1.0 / (1.0 + 1 / 1.5849625)) / 2, rel=1e-4)
    assert report["seen_items_served"] == 1
    assert report["short_answers"] == 1
    assert report["failed_requests"] == 1
    low, high = report["recall@3_interval"]
    assert 0.0 <= low <= 0.25 <= high <= 0.5  # draws of the two users' 1/2 and 0
    same = agreement(answers, Answers(lists={"a": ["y", "q", "s"], "b": ["r"]}))
    assert same == {"users_compared": 2, "identical_answers": 1, "first_differing_users": ["b"]}


def test_ask_all_counts_refusals_and_reads_each_answer() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["user_id"] == "down":
            return httpx.Response(503, json={"error": "overloaded"})
        items = [{"item_id": f"{body['user_id']}-{k}", "rank": k + 1} for k in range(2)]
        flags = ["rank:timeout"] if body["user_id"] == "slow" else []
        return httpx.Response(
            200, json={"items": items, "cold_start": body["user_id"] == "new", "degraded": flags}
        )

    transport = httpx.MockTransport(answer)
    got = asyncio.run(
        live_evaluation.ask_all(
            "http://service", ["u", "down", "slow", "new"], 2, transport=transport
        )
    )
    assert got.lists == {
        "u": ["u-0", "u-1"],
        "slow": ["slow-0", "slow-1"],
        "new": ["new-0", "new-1"],
    }
    assert got.failed == 1
    assert got.cold_start == 1
    assert dict(got.degraded) == {"rank:timeout": 1}


def test_evaluate_needs_a_service_or_a_world(tmp_path: Path) -> None:
    later = _log(tmp_path / "l.csv", [("a", "x", 3, 5.0)])
    assert main(["evaluate", "--interactions", str(later), "--weight-col", "rating"]) == 2


def test_the_interval_holds_the_mean_and_narrows_as_users_grow() -> None:
    few, many = [0.0, 1.0] * 50, [0.0, 1.0] * 800
    wide, narrow = bootstrap_interval(few, seed=3), bootstrap_interval(many, seed=3)
    assert wide is not None
    assert narrow is not None
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]
    # 95%: 1.96 standard errors of a mean of coin flips, 0.098 for 100 users, 0.0245 for
    # 1,600 (a 90% interval would give 0.082 and 0.021, a 99% one 0.129 and 0.032).
    for bounds, half in ((wide, 0.098), (narrow, 0.0245)):
        assert 0.9 * half < 0.5 - bounds[0] < 1.1 * half, bounds
        assert 0.9 * half < bounds[1] - 0.5 < 1.1 * half, bounds
    assert bootstrap_interval(few, seed=3) == wide  # one seed, one interval
    assert bootstrap_interval([0.3] * 20, seed=3) == [0.3, 0.3]
    assert bootstrap_interval([0.3], seed=3) is None
    assert bootstrap_interval([], seed=3) is None


def test_the_interval_of_many_users_is_drawn_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [0.0, 0.5, 1.0] * 400
    whole = bootstrap_interval(values, seed=5)
    monkeypatch.setattr(measures, "DRAWN_AT_ONCE", 3 * 1200)  # three draws a block
    assert bootstrap_interval(values, seed=5) == whole


def test_the_claims_interval_is_read_from_the_report_and_held_against(tmp_path: Path) -> None:
    world = tmp_path / "world"
    world.mkdir()
    rank: dict[str, object] = {"recall@10": 0.2, "recall@10_interval": [0.18, 0.22]}
    (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": {"rank": rank}}}))
    bounds = build_claim_interval(world, 10)
    assert bounds == [0.18, 0.22]
    assert inside(0.19, bounds) is True
    assert inside(0.17, bounds) is False
    assert inside(None, bounds) is None
    del rank["recall@10_interval"]  # a build from before intervals were reported
    (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": {"rank": rank}}}))
    assert build_claim_interval(world, 10) is None
    assert inside(0.19, None) is None
    odd = ([0.18], ["0.18", 0.22], [True, 0.22], {"low": 0.18}, [0.22, 0.18], [0.1, 10**400])
    for written in (*odd, [0.1, float("inf")], [float("nan"), 0.2]):
        rank["recall@10_interval"] = written  # not what a build writes: none, not a crash
        (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": {"rank": rank}}}))
        assert build_claim_interval(world, 10) is None, written
    (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": {"rank": 0.2}}}))
    assert build_claim_interval(world, 10) is None
    assert build_claim(world, 10) == {"rank": None}
    for figure in ("0.2", True, [0.2], None):
        rank = {"recall@10": figure}
        (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": {"rank": rank}}}))
        assert build_claim(world, 10) == {"rank": None}, figure
    (world / REPORT_FILE).write_text('{"evaluation": {"stages": {"rank": {"recall@10": NaN}}}}')
    assert build_claim(world, 10) == {"rank": None}
    (world / REPORT_FILE).write_text(json.dumps({"evaluation": {"stages": [0.2]}}))
    with pytest.raises(ConfigError, match="no build report to compare with"):
        build_claim(world, 10)
    (world / REPORT_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="is not the build's JSON report"):
        build_claim_interval(world, 10)
    (world / REPORT_FILE).unlink()
    with pytest.raises(ConfigError, match="no build report to compare with"):
        build_claim(world, 10)
