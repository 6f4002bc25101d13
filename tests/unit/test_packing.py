import numpy as np
import pytest

from app.pipeline.packing import encode_context, language_of, pack_rows
from app.world.schema import parse_schema
from tests.unit.tiny_schema import TINY_SCHEMA_JSON, tiny_schema


def test_context_one_hots_and_falls_back_to_other() -> None:
    schema = tiny_schema()
    # device mobile, page unknown -> other, locale en-US -> en, Saturday
    encoded = encode_context(schema, "mobile", "checkout", "en-US", hour=9, weekday=5)
    np.testing.assert_array_equal(encoded, [1, 0, 0, 1, 1, 0, 1])


def test_context_weekday_is_not_weekend() -> None:
    encoded = encode_context(tiny_schema(), "tv", "home", "fr", hour=0, weekday=2)
    np.testing.assert_array_equal(encoded, [0, 1, 1, 0, 0, 1, 0])


@pytest.mark.parametrize(("hour", "expected"), [(0, [0, 1]), (6, [1, 0]), (18, [-1, 0])])
def test_hour_of_day_is_cyclic(hour: int, expected: list[float]) -> None:
    schema = parse_schema(TINY_SCHEMA_JSON.replace('["is_weekend"]', '["hour_sin", "hour_cos"]'))
    encoded = encode_context(schema, "other", "other", "other", hour=hour, weekday=0)
    np.testing.assert_allclose(encoded[-2:], expected, atol=1e-6)


@pytest.mark.parametrize(
    ("locale", "language"), [("zh-Hans-CN", "zh"), ("en_GB", "en"), ("DE", "de"), ("", "")]
)
def test_language_of(locale: str, language: str) -> None:
    assert language_of(locale) == language


def test_pack_rows_lays_out_every_block() -> None:
    schema = tiny_schema()
    user = np.array([1.0, 2.0, 0.5], dtype=np.float32)  # embedding [1, 2], activity 0.5
    items = np.array([[3.0, 4.0, 9.0], [-1.0, 0.0, 7.0]], dtype=np.float32)
    context = np.array([1, 0, 1, 0, 1, 0, 0], dtype=np.float32)

    rows = pack_rows(schema, user, items, context)

    np.testing.assert_array_equal(
        rows,
        [
            [1, 2, 3, 4, 3, 8, 9, 0.5, 1, 0, 1, 0, 1, 0, 0],
            [1, 2, -1, 0, -1, 0, 7, 0.5, 1, 0, 1, 0, 1, 0, 0],
        ],
    )
    assert rows.dtype == np.float32
    assert rows.shape == (2, schema.width)


def test_pack_rows_takes_one_user_and_context_per_row_for_training() -> None:
    schema = tiny_schema()
    users = np.array([[1, 0, 0.1], [0, 1, 0.2]], dtype=np.float32)
    items = np.array([[2, 2, 5], [3, 3, 6]], dtype=np.float32)
    contexts = np.eye(2, 7, dtype=np.float32)

    rows = pack_rows(schema, users, items, contexts)

    np.testing.assert_array_equal(rows[:, 4:6], [[2, 0], [0, 3]])  # products
    np.testing.assert_array_equal(rows[:, 7], np.array([0.1, 0.2], dtype=np.float32))
    np.testing.assert_array_equal(rows[:, 8:], contexts)


def test_pack_rows_reuses_the_given_buffer() -> None:
    schema = tiny_schema()
    buffer = np.full((4, schema.width), -1.0, dtype=np.float32)
    rows = pack_rows(
        schema,
        np.zeros(3, np.float32),
        np.ones((2, 3), np.float32),
        np.zeros(7, np.float32),
        out=buffer,
    )
    assert np.shares_memory(rows, buffer)
    assert rows.shape == (2, schema.width)
    np.testing.assert_array_equal(buffer[2:], -1.0)


@pytest.mark.parametrize(
    ("user_width", "item_width", "context_width", "message"),
    [(2, 3, 7, "user blob"), (3, 4, 7, "item blobs"), (3, 3, 6, "context")],
)
def test_pack_rows_rejects_wrong_widths(
    user_width: int, item_width: int, context_width: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pack_rows(
            tiny_schema(),
            np.zeros(user_width, np.float32),
            np.zeros((2, item_width), np.float32),
            np.zeros(context_width, np.float32),
        )
