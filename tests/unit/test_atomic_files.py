"""Replacing a file whole and durably: the old content or the new, never a torn one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.atomic_files import copy_atomically, write_atomically


def test_the_file_is_replaced_and_both_it_and_the_rename_reach_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "release.toml"
    target.write_text("old")
    target.chmod(0o640)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording)
    write_atomically(target, b"new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert synced[-1] == str(tmp_path)  # the directory, after the rename
    assert len(synced) == 2  # the staged file first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release.toml"]


def test_a_failed_write_leaves_the_old_file_and_no_stray(tmp_path: Path) -> None:
    target = tmp_path / "config.pbtxt"
    target.write_text("old")
    with pytest.raises(FileNotFoundError):
        copy_atomically(tmp_path / "absent", target)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.pbtxt"]


def test_a_copy_lands_whole(tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(os.urandom(100_000))
    (tmp_path / "1").mkdir()
    copy_atomically(source, tmp_path / "1" / "model.onnx")
    assert (tmp_path / "1" / "model.onnx").read_bytes() == source.read_bytes()
