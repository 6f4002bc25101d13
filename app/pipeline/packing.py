"""Pure functions that turn features into the ranking model's fixed-width FP32 rows."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from app.world.schema import FeatureSchema

FloatArray = npt.NDArray[np.float32]


def _one_hot_index(vocabulary: tuple[str, ...], value: str) -> int:
    return vocabulary.index(value if value in vocabulary else "other")


def language_of(locale: str) -> str:
    """'zh-Hans-CN' and 'zh_CN' are both 'zh'."""
    return locale.replace("_", "-").split("-", 1)[0].lower()


def encode_context(
    schema: FeatureSchema, device: str, page: str, locale: str, hour: int, weekday: int
) -> FloatArray:
    """One-hot device, page and language (unknown values fall into 'other'), cyclic hour."""
    vec = np.zeros(schema.context_width, dtype=np.float32)
    offset = 0
    for vocabulary, value in (
        (schema.devices, device),
        (schema.pages, page),
        (schema.locales, language_of(locale)),
    ):
        vec[offset + _one_hot_index(vocabulary, value)] = 1.0
        offset += len(vocabulary)
    angle = 2.0 * math.pi * hour / 24.0
    time_values = {
        "hour_sin": math.sin(angle),
        "hour_cos": math.cos(angle),
        "is_weekend": 1.0 if weekday >= 5 else 0.0,
    }
    for position, name in enumerate(schema.time_features):
        vec[offset + position] = time_values[name]
    return vec


def _check_width(name: str, value: FloatArray, width: int, n_items: int) -> None:
    if value.shape not in ((width,), (n_items, width)):
        raise ValueError(f"{name} has shape {value.shape}, want ({width},) or ({n_items}, {width})")


def pack_rows(
    schema: FeatureSchema,
    user_blob: FloatArray,
    item_blobs: FloatArray,
    context: FloatArray,
    out: FloatArray | None = None,
    sequence: FloatArray | None = None,
) -> FloatArray:
    """Build the [n_items, schema.width] model input.

    item_blobs holds one [embedding | dense] row per candidate. user_blob ([embedding | dense])
    and context are one row shared by every candidate when serving, or one row per candidate
    when building training data; the same function packs both. Passing `out` reuses a buffer.
    `sequence` ([n_items, len(schema.sequence)]) is required when the schema declares signals.
    """
    if item_blobs.ndim != 2 or item_blobs.shape[1] != schema.item_blob_width:
        raise ValueError(
            f"item blobs have shape {item_blobs.shape}, want (n, {schema.item_blob_width})"
        )
    n_items = item_blobs.shape[0]
    _check_width("user blob", user_blob, schema.user_blob_width, n_items)
    _check_width("context", context, schema.context_width, n_items)
    rows = out[:n_items] if out is not None else np.empty((n_items, schema.width), np.float32)
    dim = schema.embedding_dim
    user_embedding, item_embeddings = user_blob[..., :dim], item_blobs[:, :dim]
    blocks = schema.blocks
    rows[:, blocks["user_embedding"]] = user_embedding
    rows[:, blocks["item_embedding"]] = item_embeddings
    np.multiply(item_embeddings, user_embedding, out=rows[:, blocks["user_item_product"]])
    rows[:, blocks["item_dense"]] = item_blobs[:, dim:]
    rows[:, blocks["user_dense"]] = user_blob[..., dim:]
    rows[:, blocks["context"]] = context
    if schema.sequence:
        if sequence is None or sequence.shape != (n_items, len(schema.sequence)):
            shape = None if sequence is None else sequence.shape
            want = (n_items, len(schema.sequence))
            raise ValueError(f"sequence has shape {shape}, want {want}")
        rows[:, blocks["sequence"]] = sequence
    return rows
