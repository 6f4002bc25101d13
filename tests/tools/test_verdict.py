"""`recsys release judge`: the verdict's rules on counts, and the arms read from an archive
the project writes itself (the archive's own files, as recsys-archive writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from recsys_tools.cli import main
from recsys_tools.outcomes import Rate
from recsys_tools.verdict import (
    Verdict,
    acted,
    arm_rates,
    difference_interval,
    first_day_of,
    judge,
)

from app.archive.rows import ANSWERS_SCHEMA, EVENTS_SCHEMA, Kind, day_of
from app.archive.store import ArchiveStore

NOW_MS = 1_796_326_702_000


def test_too_few_answers_waits_whatever_the_rates() -> None:
    verdict = judge(Rate(10, 900), Rate(90, 900), 1000, 100_000, 0.05).verdict
    assert verdict is Verdict.WAIT


def test_a_clearly_worse_candidate_is_rolled_back() -> None:
    judgement = judge(Rate(1000, 10_000), Rate(800, 10_000), 1000, 100_000, 0.05)
    assert judgement.verdict is Verdict.ROLL_BACK
    assert judgement.interval[1] < 0


def test_a_candidate_as_good_is_promoted_once_the_interval_is_narrow() -> None:
    assert judge(Rate(100, 1000), Rate(100, 1000), 1000, 100_000, 0.05).verdict is Verdict.WAIT
    big = judge(Rate(10_000, 100_000), Rate(10_050, 100_000), 1000, 1_000_000, 0.05)
    assert big.verdict is Verdict.PROMOTE


def test_an_undecided_candidate_is_rolled_back_at_the_most_answers() -> None:
    verdict = judge(Rate(100, 1000), Rate(97, 1000), 1000, 1000, 0.05).verdict
    assert verdict is Verdict.ROLL_BACK


def test_the_interval_holds_the_difference_and_widens_with_fewer_answers() -> None:
    low, high = difference_interval(Rate(100, 1000), Rate(120, 1000))
    assert low < 0.02 < high
    narrow = difference_interval(Rate(1000, 10_000), Rate(1200, 10_000))
    assert narrow[1] - narrow[0] < high - low
    assert narrow[0] > 0


def write_archive(
    root: Path,
    clicks: dict[str, float],
    answers: int,
    seed: int = 3,
    worlds: tuple[str, str] = ("stable-w", "candidate-w"),
) -> None:
    """Answers split between two worlds (stable, candidate: a 10% canary), a share of each
    clicked (naming its answer)."""
    rng = np.random.default_rng(seed)
    store = ArchiveStore(str(root))
    rows, events = [], []
    stable, candidate = worlds
    for n in range(answers):
        world = stable if n % 10 else candidate
        answer_id = f"{n:032x}"
        rows.append(
            {
                "answer_id": answer_id,
                "ts_ms": NOW_MS + n,
                "user_id": f"u{n}",
                "page": "home",
                "variant": "stable",
                "model_version": "1",
                "world_id": world,
                "degraded": False,
                "items": ["i1", "i2"],
                "scores": [0.5, 0.4],
                "entry": "1-0",
            }
        )
        if rng.random() < clicks[world]:
            for copy in range(2):  # two clicks on one answer count once
                events.append(
                    {
                        "event_id": f"e{n}-{copy}",
                        "user_id": f"u{n}",
                        "item_id": "i1",
                        "type": "click",
                        "ts_ms": NOW_MS + n + 1,
                        "value": None,
                        "answer_id": answer_id,
                        "entry": "2-0",
                    }
                )
    store.write(Kind.ANSWERS, pa.Table.from_pylist(rows, schema=ANSWERS_SCHEMA))
    store.write(Kind.EVENTS, pa.Table.from_pylist(events, schema=EVENTS_SCHEMA))


def test_the_arms_are_read_from_the_archive_each_answer_counted_once(tmp_path: Path) -> None:
    write_archive(tmp_path, {"stable-w": 0.1, "candidate-w": 0.3}, 20_000)
    rates = arm_rates(ArchiveStore(str(tmp_path)), "world_id", "", "9999")
    assert rates["stable-w"]["click"].trials == 18_000
    assert rates["candidate-w"]["click"].trials == 2000
    assert rates["stable-w"]["click"].value == pytest.approx(0.1, abs=0.01)
    assert rates["candidate-w"]["click"].value == pytest.approx(0.3, abs=0.03)
    assert rates["candidate-w"]["like"].value == 0.0


def test_the_command_says_promote_for_a_better_canary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_archive(tmp_path, {"stable-w": 0.1, "candidate-w": 0.2}, 20_000)
    assert main(["release", "judge", "--archive", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["stable"], report["candidate"]) == ("stable-w", "candidate-w")
    assert report["verdict"] == "promote"
    write_archive(tmp_path / "worse", {"stable-w": 0.2, "candidate-w": 0.1}, 20_000)
    assert main(["release", "judge", "--archive", str(tmp_path / "worse")]) == 0
    assert "verdict: roll back" in capsys.readouterr().out


def test_acting_on_a_verdict_promotes_rolls_back_or_leaves_the_candidate() -> None:
    called: list[str] = []

    def admin(verb: str) -> dict[str, str]:
        called.append(verb)
        return {"stable": "w-new" if verb == "promote" else "w-old"}

    assert "promoted, world w-new" in acted(Verdict.PROMOTE, admin)
    assert "rolled back, world w-old" in acted(Verdict.ROLL_BACK, admin)
    assert "nothing" in acted(Verdict.WAIT, admin)
    assert called == ["promote", "rollback"]


def test_a_worlds_first_day_is_its_first_answers(tmp_path: Path) -> None:
    write_archive(tmp_path, {"stable-w": 0.1, "candidate-w": 0.2}, 2000)
    store = ArchiveStore(str(tmp_path))
    assert first_day_of(store, "candidate-w") == day_of(NOW_MS)
    assert first_day_of(store, "never-served") == ""
