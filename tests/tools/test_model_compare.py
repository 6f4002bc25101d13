"""`recsys model compare` on a tiny synthetic world: FP16 barely moves, INT8 runs and reports."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from recsys_tools.model import command
from recsys_tools.model.compare import (
    CompareOptions,
    Comparison,
    ModelReport,
    compare_models,
    render_text,
)
from recsys_tools.model.holdout import load_holdout
from recsys_tools.world.recipes.demo import DemoSize, build_demo_world

from app.core.errors import ConfigError
from app.world.layout import HOLDOUT_FILE, MANIFEST_FILE, MODEL_FILE
from app.world.schema import FeatureSchema, load_schema

TINY = DemoSize(items=600, users=100, impressions=8000)
OPTIONS = CompareOptions(candidates=200, top=20)


@pytest.fixture(scope="module")
def schema() -> FeatureSchema:
    return load_schema()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, schema: FeatureSchema) -> Path:
    path = tmp_path_factory.mktemp("compare") / "world"
    build_demo_world(path, schema, TINY, seed=5)
    return path


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kept")


@pytest.fixture(scope="module")
def report(world: Path, schema: FeatureSchema, kept: Path) -> Comparison:
    return compare_models(world, schema, CompareOptions(candidates=200, top=20, out=kept))


def _model(report: Comparison, precision: str) -> ModelReport:
    return next(model for model in report.models if model.precision == precision)


def _copy(world: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "world"
    shutil.copytree(world, copy)
    return copy


def test_the_demo_holds_out_its_rankers_test_rows(report: Comparison, world: Path) -> None:
    training = json.loads((world / MANIFEST_FILE).read_text())["training"]
    assert report.rows == training["test_rows"]
    assert report.holdout == str(world / HOLDOUT_FILE)
    # onnxruntime's FP32 scores of the same rows give the AUC the build reported.
    assert _model(report, "fp32").auc == pytest.approx(training["auc_model"], abs=1e-3)


def test_fp16_barely_moves_and_int8_reports(report: Comparison) -> None:
    assert [model.precision for model in report.models] == ["fp32", "fp16", "int8"]
    assert report.requests == report.rows // 200
    for model in report.models:
        assert 0.0 <= model.auc <= 1.0
        assert model.batch_ms_p99 >= model.batch_ms_p50 > 0
    fp32, fp16, int8 = report.models
    assert fp32.against_fp32 is None
    assert fp16.against_fp32 is not None
    assert int8.against_fp32 is not None
    assert abs(fp16.against_fp32.auc_loss) < 0.01
    assert fp16.against_fp32.top_overlap_mean > 0.9
    assert fp16.against_fp32.kendall_tau_mean > 0.9
    assert fp16.against_fp32.max_abs_diff < 0.01
    assert 0.0 <= int8.against_fp32.top_overlap_min <= int8.against_fp32.top_overlap_mean <= 1
    assert np.isfinite(int8.against_fp32.spearman_mean)
    assert int8.size_bytes < fp32.size_bytes
    assert fp16.size_bytes < fp32.size_bytes


def test_out_keeps_the_converted_models(report: Comparison, kept: Path) -> None:
    for precision in ("fp16", "int8"):
        path = _model(report, precision).path
        assert path is not None
        assert Path(path).parent == kept
        assert Path(path).is_file()


def test_text_report_names_every_figure_and_the_gpu_path(report: Comparison) -> None:
    text = render_text(report)
    for label in ("AUC loss vs fp32", "top-20 overlap mean", "Kendall tau", "file size", "ms p50"):
        assert label in text
    assert "INT8 loses" in text or "INT8 gains" in text
    assert "TensorRT engine on a GPU host is compared the same way" in text


def test_command_prints_json(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command", required=True))
    argv = ["model", "compare", "--world", str(world), "--precision", "fp16", "--rows", "400"]
    args = parser.parse_args([*argv, "--candidates", "100", "--top", "10", "--json"])
    args.run(args)
    printed = json.loads(capsys.readouterr().out)
    assert (printed["rows"], printed["requests"], printed["top"]) == (400, 4, 10)
    assert set(printed["models"]) == {"fp32", "fp16"}
    assert printed["models"]["fp16"]["path"] is None
    assert set(printed["models"]["fp16"]["against_fp32"]) == {
        "auc_loss",
        "top_overlap_mean",
        "top_overlap_min",
        "kendall_tau_mean",
        "spearman_mean",
        "max_abs_diff",
        "mean_abs_diff",
        "ties_added",
        "tied_gap_max",
    }
    assert "TensorRT" in printed["tensorrt"]


def test_a_saved_holdout_is_used(world: Path, schema: FeatureSchema, tmp_path: Path) -> None:
    copy = _copy(world, tmp_path)
    held = load_holdout(world, schema)
    np.savez(copy / HOLDOUT_FILE, rows=held.rows[:300], labels=held.labels[:300])
    report = compare_models(copy, schema, CompareOptions(("fp16",), candidates=100))
    assert report.holdout == str(copy / HOLDOUT_FILE)
    assert report.rows == 300


def test_a_world_without_model_is_refused(tmp_path: Path, schema: FeatureSchema) -> None:
    with pytest.raises(ConfigError, match=f"{MODEL_FILE} is missing: build the world"):
        compare_models(tmp_path, schema, OPTIONS)


def test_a_world_without_holdout_is_refused(
    world: Path, schema: FeatureSchema, tmp_path: Path
) -> None:
    copy = _copy(world, tmp_path)
    (copy / HOLDOUT_FILE).unlink()
    with pytest.raises(ConfigError, match=f"{HOLDOUT_FILE} is missing: rebuild the world"):
        compare_models(copy, schema, OPTIONS)


@pytest.mark.parametrize("flag", ["--rows", "--top", "--candidates"])
def test_a_flag_below_one_is_refused(world: Path, flag: str) -> None:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["model", "compare", "--world", str(world), flag, "0"])
    with pytest.raises(ConfigError, match=f"{flag} 0: give a positive number"):
        args.run(args)
