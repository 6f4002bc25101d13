"""Reading the world's numpy files: numpy's many ways of failing on a damaged file (a
truncated zip, a missing array, a wrong shape) become one ConfigError naming the file."""

from __future__ import annotations

import contextlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

from app.core.errors import ConfigError


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    try:
        yield
    # TypeError: a file of another kind under the name (an .npy array is no archive to open).
    except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from exc
