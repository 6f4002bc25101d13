"""The deployment docs, the host set-up script and `recsys doctor` name one Podman version
for the quadlets: an operator told 4.4 in one place and 4.9 in another cannot tell which."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from recsys_tools.doctor.checks import QUADLET_PODMAN

ROOT = Path(__file__).resolve().parents[2]
# Every way the files state the version from which the quadlets are to be used.
STATEMENTS = (
    r"[Pp]odman (\d+\.\d+) and later",
    r"quadlets \((\d+\.\d+)\+\)",
    r"generator of Podman (\d+\.\d+)",
    r"quadlet of Podman (\d+\.\d+)",
    r"Before Podman (\d+\.\d+), use",
    r"older than (\d+\.\d+)\): use the plain units",
)
FILES = (
    "docs/deploying.md",
    "deploy/quadlet/README.md",
    "deploy/host/README.md",
    "deploy/host/setup-gpu-host.sh",
    "deploy/quadlet/recsys-triton.container",
)


def _stated(text: str) -> list[str]:
    return [found for pattern in STATEMENTS for found in re.findall(pattern, text)]


@pytest.mark.parametrize("name", FILES)
def test_each_file_names_the_doctors_quadlet_version(name: str) -> None:
    text = (ROOT / name).read_text()
    stated = _stated(text)
    assert stated, f"{name} no longer says from which Podman the quadlets apply"
    expected = ".".join(str(part) for part in QUADLET_PODMAN)
    assert set(stated) == {expected}, f"{name} says {stated}; the doctor says {expected}"


def test_the_statements_are_found_where_they_disagree() -> None:
    # The test above can fail: a file that named another version would be caught.
    assert _stated("Install the quadlets (Podman 4.4 and later)") == ["4.4"]
    assert _stated("use the quadlets (4.4+) or the plain units") == ["4.4"]
