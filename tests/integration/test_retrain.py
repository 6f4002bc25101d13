"""`recsys retrain` as the timer runs it: a real process building the next world from a base
log and an archive (ratings, and the answers the serving world gave with the clicks on them),
judged against the world serving; accepted, refused, and killed in the middle of its build,
with the world serving untouched throughout; the ranker learnt from the answers compared with
the one learnt from candidate lists, and shipped when asked. The generated days are in the
past: each run is told the day after them as its today (--today), and the archive also holds
a row of that day and one stamped decades on, which the window leaves out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest
from recsys_tools.retrain import CANDIDATE_LINK
from recsys_tools.retrain_progress import STATE_FILE
from recsys_tools.world.generate.drift import DAY, START, DailyShape, daily_drift
from recsys_tools.world.learn.derive import interactions_schema_path
from recsys_tools.world.read.log import LogColumns
from recsys_tools.world.recipes.from_log import build_world_from_log
from recsys_tools.world.recipes.recipe import WorldRecipe

from app.archive.rows import EVENTS_SCHEMA, Kind, day_of
from app.archive.store import ArchiveStore
from app.world.layout import MODEL_FILE, STAMPED_FILES
from app.world.schema import load_schema
from app.world.stamp import WORLD_ID_PARAMETER, read_stamp, verify_files
from loadtest.retrain_drift import write_answers, write_archive

SHAPE = DailyShape(groups=8, items_per_group=40, users=300, history_days=10, later_days=4)
# Generous: a small build takes seconds here; a slow, busy machine may take far longer.
STEP_WITHIN_S = 180.0
# The generated days are START's 24 hours, not UTC days: the later ones end inside the UTC
# day judged on, and the runs' today is the UTC day after it.
JUDGED = day_of((START + (SHAPE.history_days + SHAPE.later_days) * DAY - 1) * 1000)
TODAY = str(np.datetime64(JUDGED, "D") + 1)
TODAY_MS = int(np.datetime64(TODAY, "ms").astype(np.int64))
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: one API host's clock, or one hostile row


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The base log, the world built from it (serving) and an archive of the days after."""
    root = tmp_path_factory.mktemp("retrain")
    drift = daily_drift(3, SHAPE)
    base = drift.write_history(root / "history.csv")
    world = root / "serving"
    recipe = WorldRecipe(
        interactions=base, columns=LogColumns(weight="rating", min_weight=4.0), network="mlp"
    )
    build_world_from_log(recipe, world, load_schema(interactions_schema_path()))
    write_archive(root / "archive", drift.later)
    write_answers(root / "archive", world, drift, 3)
    later = [
        {
            "event_id": f"later-{n}",
            "user_id": "u1",
            "item_id": "i1",
            "type": "click",
            "ts_ms": ts_ms,
            "value": None,
            "answer_id": None,
            "entry": "0-0",
        }
        for n, ts_ms in enumerate([TODAY_MS + 60_000, FAR_FUTURE_MS])
    ]
    ArchiveStore(str(root / "archive")).write(
        Kind.EVENTS, pa.Table.from_pylist(later, schema=EVENTS_SCHEMA)
    )
    return base, world, root / "archive"


def _argv(served: tuple[Path, Path, Path], worlds: Path, *more: str) -> list[str]:
    base, world, archive = served
    return [
        str(Path(sys.executable).parent / "recsys"), "retrain",
        "--interactions", str(base), "--weight-col", "rating", "--min-weight", "4",
        "--archive", str(archive), "--serving", str(world), "--worlds", str(worlds),
        "--network", "mlp", "--metrics-file", str(worlds.parent / "retrain.prom"),
        "--today", TODAY, *more,
    ]  # fmt: skip


def _digests(world: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(world.iterdir()) if path.is_file()}


def test_a_better_world_is_accepted_as_the_candidate(
    served: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    before = _digests(served[1])
    worlds = tmp_path / "worlds"
    done = subprocess.run(_argv(served, worlds), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accepted" in done.stdout
    candidate = (worlds / CANDIDATE_LINK).resolve()
    stamp = read_stamp(candidate)
    assert stamp is not None
    assert stamp.world_id == candidate.name
    report = json.loads((candidate / "retrain.json").read_text())
    assert report["outcome"] == "accepted"
    assert report["rows"]["archive"] > 0
    # The window and the day judged follow the run's today, not the archive's newest row.
    assert report["held_out_day"] == JUDGED
    assert report["window"]["last"] == JUDGED
    assert report["left_out"]["today"]["archive"] == 1
    assert report["left_out"]["future"] == {"base": 0, "archive": 1, "answers": 0}
    assert set(report["seconds"]) == {
        "gather",
        "split",
        "build",
        "impressions",
        "evaluate",
        "decide",
    }
    # On tastes that drift, the world that saw the archive's days answers the last one better.
    assert report["evaluation"]["ratio"] > 1.0
    assert (
        'recsys_retrain_last_outcome{outcome="accepted"} 1'
        in (tmp_path / "retrain.prom").read_text()
    )
    assert _digests(served[1]) == before
    assert not (worlds / STATE_FILE).exists()
    # Both rankers, judged on the held-out day's answers and its users.
    ranker = report["ranker"]
    assert ranker["impressions"]["learnt_on"] == "shown and chosen against shown and skipped"
    assert ranker["impressions"]["chosen"] > 0
    ordered = ranker["held_out_answers_ndcg@10"]
    assert ordered["answers"] > 0
    for name in ("as_shown", "lists", "impressions", "lists_with_answers"):
        assert 0.0 < ordered[name] <= 1.0
    assert set(ranker["hit"]) == {"lists", "impressions", "lists_with_answers"}
    assert ranker["impressions"]["added_to_lists"]["weight"] >= 0.0
    assert report["evaluation"]["new"] == ranker["hit"][ranker["shipped"]]


def test_the_ranker_learnt_from_answers_ships_when_asked(
    served: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    worlds = tmp_path / "worlds"
    done = subprocess.run(
        _argv(served, worlds, "--ranker", "impressions", "--margin", "1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    candidate = (worlds / CANDIDATE_LINK).resolve()
    report = json.loads((candidate / "retrain.json").read_text())
    assert report["ranker"]["shipped"] == "impressions"
    assert report["evaluation"]["new"] == report["ranker"]["hit"]["impressions"]
    # Stamped again over the new model: its digest, and the id inside it, are the world's.
    stamp = read_stamp(candidate)
    assert stamp is not None
    assert stamp.world_id == candidate.name
    verify_files(candidate, stamp, STAMPED_FILES)
    model = onnx.load(str(candidate / MODEL_FILE))
    props = {prop.key: prop.value for prop in model.metadata_props}
    assert props[WORLD_ID_PARAMETER] == stamp.world_id


def test_a_world_worse_than_the_serving_one_is_refused(
    served: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    worlds = tmp_path / "worlds"
    # A margin below zero asks for ten times the serving world's hits: refused.
    argv = _argv(served, worlds, "--margin", "-9")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "refused" in done.stderr
    assert not (worlds / CANDIDATE_LINK).exists()
    metrics = (tmp_path / "retrain.prom").read_text()
    assert 'recsys_retrain_last_outcome{outcome="refused"} 1' in metrics


def test_a_retrain_killed_mid_build_leaves_the_serving_world_and_says_where_it_stopped(
    served: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    before = _digests(served[1])
    worlds = tmp_path / "worlds"
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        first = subprocess.Popen(_argv(served, worlds), stdout=log, stderr=log)
    give_up = time.monotonic() + STEP_WITHIN_S
    try:
        while _step(worlds) != "build":
            assert first.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < give_up, log_path.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(1.0)  # inside the build
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait(timeout=30)
    assert not (worlds / CANDIDATE_LINK).exists()
    assert list(worlds.glob(".building-*"))
    assert _digests(served[1]) == before
    again = subprocess.run(_argv(served, worlds), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped during its build step" in again.stderr
    assert not list(worlds.glob(".building-*"))
    assert (worlds / CANDIDATE_LINK).resolve().is_dir()
    assert _digests(served[1]) == before


def _step(worlds: Path) -> str:
    try:
        return str(json.loads((worlds / STATE_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return ""
