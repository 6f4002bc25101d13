"""The docs hold together: every link in the README and docs/ resolves (the file, and the
heading an anchor names), and every setting is documented once, in docs/configuration.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "deploy").rglob("README.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CONFIGURATION = ROOT / "docs" / "configuration.md"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # another site: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no such heading in {file.relative_to(ROOT)}")
    assert not broken, broken


def test_the_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    linked = {(ROOT / path).resolve() for path in links(ROOT / "README.md")}
    topics = sorted((ROOT / "docs").glob("*.md"))
    assert not [page.name for page in topics if page not in linked], "a docs page no link reaches"


def _documented() -> list[str]:
    """The variables each configuration table row names in its first cell."""
    names = []
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("| `RECSYS_"):
            names += re.findall(r"`(RECSYS_[A-Z0-9_]+)`", line.split("|")[1])
    return names


def test_every_setting_is_documented_once() -> None:
    documented = _documented()
    expected = {f"RECSYS_{name.upper()}" for name in Settings.model_fields}
    assert sorted(expected - set(documented)) == [], "settings no table row documents"
    assert sorted(set(documented) - expected) == [], "rows for settings that do not exist"
    twice = sorted({name for name in documented if documented.count(name) > 1})
    assert twice == [], "documented more than once"


def test_the_link_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Here\n[a](missing.md) [b](#nowhere) [c](#here)\n")
    assert links(page) == ["missing.md", "#nowhere", "#here"]
    assert anchors(page) == {"here"}
