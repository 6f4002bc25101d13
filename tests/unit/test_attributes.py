"""Item attributes: words a client asks for, null where the world has none, and a world
file with a name the service does not know refused at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.core.errors import ConfigError
from app.world.attributes import ATTRIBUTE_NAMES, ItemAttributes, load_attributes, save_attributes


def test_each_position_gets_what_was_asked_and_null_where_the_world_has_none(
    tmp_path: Path,
) -> None:
    save_attributes(tmp_path, {"title": np.array(["Kolya", "Heat"])})
    held = load_attributes(tmp_path, 2)
    assert held.names == ("title",)
    rows = held.of(np.array([1, -1, 0]), ["title", "categories"])
    assert rows == [
        {"title": "Heat", "categories": None},
        {"title": None, "categories": None},
        {"title": "Kolya", "categories": None},
    ]
    assert ItemAttributes().of(np.array([0]), ["title"]) == [{"title": None}]


def test_a_world_without_the_file_has_none_and_a_bad_file_is_refused(tmp_path: Path) -> None:
    assert load_attributes(tmp_path, 3).names == ()
    save_attributes(tmp_path, {"title": np.array(["a", "b"])})
    with pytest.raises(ConfigError, match="for a catalog of 3 items"):
        load_attributes(tmp_path, 3)
    save_attributes(tmp_path, {"price": np.array(["1", "2"])})
    with pytest.raises(ConfigError, match="not attributes the service knows"):
        load_attributes(tmp_path, 2)
    # Nothing to write removes an older build's file.
    save_attributes(tmp_path, {})
    assert load_attributes(tmp_path, 2).names == ()
    assert set(ATTRIBUTE_NAMES) == {"title", "categories"}
