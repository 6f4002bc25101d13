"""A schema small enough to write its packed rows out by hand."""

from app.world.schema import FeatureSchema, parse_schema

TINY_SCHEMA_JSON = """
{
  "version": 1,
  "model": {"name": "m", "input": "features", "output": "score", "datatype": "FP32",
            "score": "log_odds"},
  "embedding_dim": 2,
  "user_dense": ["activity"],
  "item_dense": ["price"],
  "context": {
    "device": ["mobile", "other"],
    "page": ["home", "other"],
    "locale": ["en", "other"],
    "time": ["is_weekend"]
  },
  "layout": ["user_embedding", "item_embedding", "user_item_product",
             "item_dense", "user_dense", "context"]
}
"""


def tiny_schema() -> FeatureSchema:
    return parse_schema(TINY_SCHEMA_JSON)


def tiny_sequence_schema() -> FeatureSchema:
    """The tiny schema with both sequence signals, packed last."""
    raw = TINY_SCHEMA_JSON.replace(
        '"layout": [', '"sequence": ["similar", "recent"],\n  "layout": ["sequence", '
    )
    return parse_schema(raw)
