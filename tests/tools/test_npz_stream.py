"""The streamed .npz: read back by np.load as np.savez's own, refused when short or long."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from recsys_tools.world.store.npz_stream import NpzStream

from app.core.errors import ConfigError


def test_a_streamed_file_reads_back_as_savez_writes_it(tmp_path: Path) -> None:
    ids = np.array(["7", "296", "1000001"])
    vectors = np.arange(12, dtype=np.float32).reshape(6, 2)
    with NpzStream(tmp_path / "streamed.npz") as out:
        out.array("ids", ids.dtype, ids.shape, [ids[:1], ids[1:]])
        out.array("vectors", np.float32, vectors.shape, [vectors[:4], vectors[4:]])
    np.savez(tmp_path / "whole.npz", ids=ids, vectors=vectors)
    with np.load(tmp_path / "streamed.npz") as streamed, np.load(tmp_path / "whole.npz") as whole:
        assert sorted(streamed.files) == sorted(whole.files)
        for name in whole.files:
            assert streamed[name].dtype == whole[name].dtype
            assert np.array_equal(streamed[name], whole[name])


@pytest.mark.parametrize("rows", [3, 5])
def test_a_stream_of_the_wrong_length_leaves_no_file(tmp_path: Path, rows: int) -> None:
    path = tmp_path / "table.npz"
    with (
        pytest.raises(ConfigError, match="table changed while it was written"),
        NpzStream(path) as out,
    ):
        out.array("ids", np.int64, (4,), [np.arange(rows)])
    assert not path.exists()
