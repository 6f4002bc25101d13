import numpy as np
import pytest

from app.clients.feature_store import (
    BlobState,
    decode_item_blobs,
    decode_seen,
    decode_user,
    encode_seen,
    layout_meta,
)
from app.release.keyspace import KeySpace
from tests.unit.tiny_schema import tiny_schema


def _blob(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


def test_item_blobs_stack_in_request_order_skipping_missing_and_malformed() -> None:
    values = [_blob(1, 2, 3), None, _blob(4, 5), _blob(7, 8, 9)]
    decoded = decode_item_blobs(values, width=3)
    assert decoded.found.tolist() == [0, 3]
    np.testing.assert_array_equal(decoded.matrix, [[1, 2, 3], [7, 8, 9]])
    assert decoded.malformed.tolist() == [2]


def test_no_blobs() -> None:
    decoded = decode_item_blobs([None, None], width=3)
    assert decoded.matrix.shape == (0, 3)
    assert decoded.found.tolist() == []
    assert decoded.malformed.tolist() == []


def test_user_blob_must_have_the_schema_width() -> None:
    present = decode_user(_blob(1, 2, 3), encode_seen([1, 2]), 3)
    assert present.state is BlobState.PRESENT
    assert present.blob is not None
    np.testing.assert_array_equal(present.blob, [1, 2, 3])
    assert present.seen.tolist() == [1, 2]
    assert present.seen_whole
    malformed = decode_user(_blob(1, 2), None, 3)
    assert (malformed.state, malformed.blob) == (BlobState.MALFORMED, None)
    absent = decode_user(None, None, 3)
    assert (absent.state, absent.blob, absent.seen.tolist()) == (BlobState.ABSENT, None, [])


def test_a_seen_list_is_appendable_and_has_no_length_limit() -> None:
    history = np.arange(100_000, dtype=np.int64)[::-1]
    stored = encode_seen(history[:60_000]) + encode_seen(history[60_000:])  # two APPENDs
    positions, whole = decode_seen(stored)
    assert whole
    np.testing.assert_array_equal(positions, history)
    assert positions.dtype == np.int64


def test_a_torn_seen_list_keeps_its_whole_entries_and_says_so() -> None:
    positions, whole = decode_seen(encode_seen([7, 9]) + b"\x01\x02")
    assert positions.tolist() == [7, 9]
    assert not whole


def test_key_space() -> None:
    keys = KeySpace("rs")
    assert (keys.user("u1"), keys.item("i2"), keys.seen("u1"), keys.meta) == (
        "rs:u:{u1}",
        "rs:i:i2",
        "rs:seen:{u1}",
        "rs:meta",
    )


def test_every_key_of_a_user_shares_a_slot_on_a_cluster() -> None:
    from redis.crc import key_slot

    keys = KeySpace("rs")
    user = "alice:{odd}"
    named = [keys.user(user), keys.seen(user), keys.positives(user)]
    named += [keys.impressions(user), keys.applied(user)]
    assert len({key_slot(key.encode()) for key in named}) == 1


def test_a_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ValueError, match="braces"):
        KeySpace("rs{x}")


def test_item_keys_are_encoded_once_for_the_whole_catalog() -> None:
    keys = KeySpace("rs").item_keys(np.array(["i0", "sku-17", "größe"]))
    assert keys.tolist() == [b"rs:i:i0", b"rs:i:sku-17", "rs:i:größe".encode()]
    assert keys[np.array([2, 0])].tolist() == [keys[2], keys[0]]


def test_layout_meta_names_the_blob_layout() -> None:
    assert layout_meta(tiny_schema()) == {
        "schema_version": "1",
        "embedding_dim": "2",
        "user_dense": "activity",
        "item_dense": "price",
        "seen_format": "positions-u32le",
        "user_keys": "tagged",
    }
