"""The demo's first screen: a step a line in words, the answer as a table, the rest in the
log file; and the demo world's words (titles, genres) drawn the same from one seed."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from recsys_tools.demo_screen import SCREEN, answer_table, demo_logging, said_answer, said_training
from recsys_tools.world.generate.titles import GENRES, generated_attributes, generated_titles

ANSWER = {
    "items": [
        {
            "item_id": "i9",
            "score": 0.7081,
            "rank": 1,
            "attributes": {"title": "Quiet Harbor", "categories": "drama"},
        },
        {
            "item_id": "i12345",
            "score": None,
            "rank": 2,
            "attributes": {"title": "A" * 40, "categories": ""},
        },
    ],
    "model": {"name": "ranking_model", "version": "1"},
    "degraded": [],
    "cold_start": False,
    "timings_ms": {"recall": 1.25, "rank": 4.0},
}


def test_the_answer_is_a_table_with_the_title_first() -> None:
    lines = answer_table(ANSWER)
    assert lines[0].split() == ["rank", "item", "score", "title", "categories"]
    assert lines[1].split()[:5] == ["1", "i9", "0.708", "Quiet", "Harbor"]
    assert lines[1].endswith("drama")
    # No score (a degraded answer's backfill) is a dash; a long title is cut, not wrapped.
    assert lines[2].split()[2] == "-"
    assert "A" * 27 + "…" in lines[2]
    assert len(lines) == 3
    bare = answer_table({"items": [{"item_id": "i1", "score": 0.5, "rank": 1}]})
    assert bare == ["rank  item   score", "   1  i1     0.500"]


def test_figures_are_sentences() -> None:
    said = said_answer(ANSWER, 16.4)
    assert said == (
        "Answered in 16 ms (stages in ms: recall 1.2, rank 4.0), ranked by model "
        "ranking_model version 1; nothing degraded."
    )
    degraded = {**ANSWER, "model": {"name": "m", "version": None}, "degraded": ["rank:timeout"]}
    assert "ranked by the fallback ranker; degraded: rank:timeout" in said_answer(degraded, 3)
    training = said_training(
        {
            "auc_model": 0.771,
            "auc_popularity": 0.53,
            "auc_heads": {"interact": 0.77, "like": 0.78},
            "test_rows": 39710,
            "network": "mlp",
            "flops_per_row": 19712,
        }
    )
    assert training == (
        "The ranker (MLP, 19,712 FLOPs a row) tells a click from a skip with AUC 0.77 on "
        "39,710 impressions it did not learn from (popularity alone: 0.53); its like head "
        "tells a like among clicks with AUC 0.78."
    )
    assert "{" not in said_training({})


def test_only_the_screens_lines_and_problems_reach_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        demo_logging(tmp_path / "demo.log")
        logging.getLogger(SCREEN).info("Redis holds the world.")
        logging.getLogger("app.process.services").info("serving 10 items")
        logging.getLogger("httpx").info("HTTP Request: POST /recommend 503")
        logging.getLogger("app.process.services").warning("Triton is slow")
        for handler in root.handlers:
            handler.flush()
        shown = capsys.readouterr().err.splitlines()
        kept = (tmp_path / "demo.log").read_text()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger(SCREEN).handlers.clear()
    assert shown == ["Redis holds the world.", "WARNING app.process.services: Triton is slow"]
    assert "serving 10 items" in kept
    assert "Redis holds the world." in kept
    assert "503" not in kept


def test_the_demo_worlds_words_come_from_its_seed() -> None:
    titles = generated_titles(1000, seed=7)
    assert len(set(titles.tolist())) == 1000
    np.testing.assert_array_equal(titles, generated_titles(1000, seed=7))
    assert not np.array_equal(titles, generated_titles(1000, seed=8))
    words = generated_attributes(np.array([0, 3, 70]), seed=7)
    assert words["categories"].tolist() == [GENRES[0], GENRES[3], "genre 71"]
