"""What the checks see of a host: files under a root, and commands.

Checks never touch the filesystem or spawn processes themselves; they ask a `Host`. The real
one reads every file under `--root` (so a copy of a host's /proc, /sys and /etc can be
inspected elsewhere) and runs commands on this machine; tests give recorded outputs instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

COMMAND_TIMEOUT_S = 15.0


class CommandTimeoutError(Exception):
    """A command did not finish in time (a hung driver makes nvidia-smi do this)."""


class Host(Protocol):
    def read(self, path: str) -> str | None:
        """The text of the file at `path` (absolute, under the root); None if unreadable."""

    def exists(self, path: str) -> bool:
        """Whether `path` (absolute, under the root) exists."""

    def glob(self, pattern: str) -> list[str]:
        """Absolute paths (as seen under the root) matching `pattern`, sorted."""

    def run(self, argv: Sequence[str]) -> tuple[int, str] | None:
        """(exit status, stdout with stderr merged) of the command; None if it is missing."""


class LocalHost:
    """Files under `root` on this machine; commands run here, in the C locale."""

    def __init__(self, root: Path = Path("/"), timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.root = root
        self._timeout_s = timeout_s
        self._ran: dict[tuple[str, ...], tuple[int, str] | None] = {}

    def _under_root(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._under_root(path).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            return None

    def exists(self, path: str) -> bool:
        return self._under_root(path).exists()

    def glob(self, pattern: str) -> list[str]:
        try:
            matches = list(self.root.glob(pattern.lstrip("/")))
        except (OSError, ValueError):
            return []
        return sorted("/" + match.relative_to(self.root).as_posix() for match in matches)

    def run(self, argv: Sequence[str]) -> tuple[int, str] | None:
        """Each command runs once per host: several checks read nvidia-smi."""
        key = tuple(argv)
        if key not in self._ran:
            self._ran[key] = self._run(key)
        return self._ran[key]

    def _run(self, argv: tuple[str, ...]) -> tuple[int, str] | None:
        program = shutil.which(argv[0])
        if program is None:
            return None
        try:
            done = subprocess.run(
                [program, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env={**os.environ, "LC_ALL": "C"},
                timeout=self._timeout_s,
                check=False,
            )
        except FileNotFoundError:
            return None
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeoutError(
                f"{' '.join(argv)} did not finish within {self._timeout_s:.0f} s"
            ) from exc
        return done.returncode, done.stdout
