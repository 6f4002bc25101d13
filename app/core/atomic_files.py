"""Replacing a file whole: a reader, a crash or a power cut sees the old file or the new one.

The new content is written beside the file under a temporary name, flushed to disk, renamed
over the file, and the rename itself flushed (the directory's fsync): without the two
fsyncs a crash can leave the new name pointing at an empty or partial file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _replace(path: Path, fill: Callable[[BinaryIO], None]) -> None:
    descriptor, staged_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    staged = Path(staged_name)
    try:
        with os.fdopen(descriptor, "wb") as staged_file:
            fill(staged_file)
            staged_file.flush()
            os.fsync(staged_file.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(staged, path.stat().st_mode & 0o7777)  # keep the file's permissions
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_atomically(path: Path, data: bytes) -> None:
    def fill(file: BinaryIO) -> None:
        file.write(data)

    _replace(path, fill)


def copy_atomically(source: Path, target: Path) -> None:
    def fill(file: BinaryIO) -> None:
        with source.open("rb") as original:
            shutil.copyfileobj(original, file)

    _replace(target, fill)
