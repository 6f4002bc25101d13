"""Tools the checks take from Debian's archive (deploy/tools/fetch-deb, cached in var/tools)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FETCH_DEB = ROOT / "deploy" / "tools" / "fetch-deb"


@functools.cache
def debian_root(suite: str, package: str) -> Path:
    """The folder `package` (several: space-separated) of Debian `suite` is unpacked under
    (fetched on first use)."""
    result = subprocess.run(
        [str(FETCH_DEB), suite, *package.split()],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if result.returncode != 0:
        pytest.fail(f"fetch-deb {suite} {package} failed:\n{result.stdout}{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def redis_7() -> tuple[str, dict[str, str]]:
    """Debian's redis-server 7 (the deployment runs 7.2; the wheel's is 6.2, without ACL
    selectors) and the environment that finds its libraries."""
    root = debian_root("bookworm", "redis-tools redis-server liblzf1 libjemalloc2")
    libraries = ":".join(str(folder) for folder in root.glob("usr/lib/*-linux-gnu"))
    return str(root / "usr" / "bin" / "redis-server"), {"LD_LIBRARY_PATH": libraries}
