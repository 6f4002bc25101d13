"""The feature schema: one declared layout of the ranking model's input row.

The same file drives the packer, the model export and the start-up check against Triton's
model metadata, so the three can never silently disagree. The shape its model's name must
have is the one a world's id has too (NAME), held here for the service and the tools alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.core.errors import ConfigError, SchemaError
from app.world.layout import SCHEMA_FILE

# The one shape of a world's id and of a model's name, here and in the tools. Both become
# directory names (the worlds directory's, Triton's model repository's) and text inside a
# config.pbtxt, and a retrain job writes them while the job that installs them holds Triton's
# admin key: no separator, dot, quote, backslash or newline can get through.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_RULE = "letters, digits, '_' and '-', at most 64 characters"


def is_name(value: object) -> TypeGuard[str]:
    """Whether `value` is a world id or a model name (fullmatch: `$` would let a newline by)."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


def checked_name(value: object, where: str) -> str:
    """`value` when it is a name; ConfigError saying `where` it came from otherwise."""
    if not is_name(value):
        shown = repr(value)
        if len(shown) > 80:  # a hostile file's megabyte of id is not repeated in every log line
            shown = shown[:77] + "..."
        raise ConfigError(f"{where} is {shown}: a name is {NAME_RULE}")
    return value


BlockName = Literal[
    "user_embedding",
    "item_embedding",
    "user_item_product",
    "item_dense",
    "user_dense",
    "context",
    "sequence",
]
# The sequence block is optional: a schema that declares signals names it in its layout.
OPTIONAL_BLOCKS: frozenset[str] = frozenset({"sequence"})
ALL_BLOCKS: frozenset[str] = (
    frozenset(BlockName.__args__) - OPTIONAL_BLOCKS  # type: ignore[attr-defined]
)
# What relates a candidate to what the user did last (app.pipeline.signals computes them).
SequenceSignal = Literal[
    "similar", "recent", "recent_max", "recent_mean", "recent_category", "order"
]


# What the model's score output is: `log_odds` (any real number; rules add the log of their
# multipliers), or `probability` (0 to 1; rules multiply it), the default for a schema
# written before the score was a log-odds.
ScoreScale = Literal["log_odds", "probability"]


class _ModelIO(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    input: str = Field(min_length=1)
    output: str = Field(min_length=1)
    datatype: Literal["FP32"] = "FP32"
    score: ScoreScale = "probability"

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str) -> str:
        # A model directory and a config.pbtxt line are made of it (recsys install-model).
        if not is_name(value):
            raise ValueError(f"{value!r} is not a model name: {NAME_RULE}")
        return value


class _DenseFeature(BaseModel):
    """A dense feature with what it means and its scale, so whoever fills it knows both."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    meaning: str = ""
    scale: str = ""


def _dense(value: str | _DenseFeature) -> _DenseFeature:
    return _DenseFeature(name=value) if isinstance(value, str) else value


class _ContextSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    device: tuple[str, ...] = Field(min_length=1)
    page: tuple[str, ...] = Field(min_length=1)
    locale: tuple[str, ...] = Field(min_length=1)
    time: tuple[Literal["hour_sin", "hour_cos", "is_weekend"], ...]

    @property
    def width(self) -> int:
        return len(self.device) + len(self.page) + len(self.locale) + len(self.time)


class _SchemaFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = Field(ge=1)
    model: _ModelIO
    embedding_dim: int = Field(ge=1, le=4096)
    # A plain name, or {"name", "meaning", "scale"}: the file documents what it declares.
    user_dense: tuple[str | _DenseFeature, ...]
    item_dense: tuple[str | _DenseFeature, ...]
    context: _ContextSpec
    # Signals relating each candidate to the user's latest positives, packed per row.
    sequence: tuple[SequenceSignal, ...] = ()
    layout: tuple[BlockName, ...]

    @property
    def user_features(self) -> tuple[_DenseFeature, ...]:
        return tuple(_dense(value) for value in self.user_dense)

    @property
    def item_features(self) -> tuple[_DenseFeature, ...]:
        return tuple(_dense(value) for value in self.item_dense)

    @model_validator(mode="after")
    def _layout_names_every_block_once(self) -> _SchemaFile:
        wanted = ALL_BLOCKS | ({"sequence"} if self.sequence else frozenset())
        if sorted(self.layout) != sorted(wanted):
            raise ValueError(
                f"layout must name each of {sorted(wanted)} exactly once (sequence only "
                "when the schema declares sequence signals)"
            )
        if len(set(self.sequence)) != len(self.sequence):
            raise ValueError(f"sequence names a signal twice: {list(self.sequence)}")
        for side, features in (("user", self.user_features), ("item", self.item_features)):
            names = [feature.name for feature in features]
            if len(set(names)) != len(names):
                raise ValueError(f"{side}_dense names a feature twice: {names}")
        for name in ("device", "page", "locale"):
            if "other" not in getattr(self.context, name):
                raise ValueError(f"context.{name} must include 'other'")
        return self


@dataclass(frozen=True, slots=True)
class FeatureDoc:
    meaning: str
    scale: str


@dataclass(frozen=True, slots=True)
class FeatureSchema:
    """The parsed schema with every block's column range resolved once."""

    version: int
    model_name: str
    input_name: str
    output_name: str
    datatype: str
    score_scale: ScoreScale
    embedding_dim: int
    user_dense: tuple[str, ...]
    item_dense: tuple[str, ...]
    devices: tuple[str, ...]
    pages: tuple[str, ...]
    locales: tuple[str, ...]
    time_features: tuple[str, ...]
    sequence: tuple[str, ...]
    blocks: dict[str, slice]
    width: int
    # What each dense feature means and its scale, where the file says; not part of equality.
    docs: dict[str, FeatureDoc] = field(default_factory=dict, compare=False)
    # The file's text, so a world can carry the exact schema it was built for.
    source: str = field(default="", compare=False, repr=False)

    @property
    def user_blob_width(self) -> int:
        """Floats in a user's Redis blob: embedding then dense features."""
        return self.embedding_dim + len(self.user_dense)

    @property
    def item_blob_width(self) -> int:
        """Floats in an item's Redis blob: embedding then dense features."""
        return self.embedding_dim + len(self.item_dense)

    @property
    def context_width(self) -> int:
        return len(self.devices) + len(self.pages) + len(self.locales) + len(self.time_features)


def _block_widths(spec: _SchemaFile) -> dict[str, int]:
    dim = spec.embedding_dim
    return {
        "user_embedding": dim,
        "item_embedding": dim,
        "user_item_product": dim,
        "item_dense": len(spec.item_dense),
        "user_dense": len(spec.user_dense),
        "context": spec.context.width,
        "sequence": len(spec.sequence),
    }


def _from_spec(spec: _SchemaFile, source: str) -> FeatureSchema:
    widths = _block_widths(spec)
    blocks: dict[str, slice] = {}
    offset = 0
    for name in spec.layout:
        blocks[name] = slice(offset, offset + widths[name])
        offset += widths[name]
    return FeatureSchema(
        version=spec.version,
        model_name=spec.model.name,
        input_name=spec.model.input,
        output_name=spec.model.output,
        datatype=spec.model.datatype,
        score_scale=spec.model.score,
        embedding_dim=spec.embedding_dim,
        user_dense=tuple(feature.name for feature in spec.user_features),
        item_dense=tuple(feature.name for feature in spec.item_features),
        devices=spec.context.device,
        pages=spec.context.page,
        locales=spec.context.locale,
        time_features=spec.context.time,
        sequence=spec.sequence,
        blocks=blocks,
        width=offset,
        docs={
            feature.name: FeatureDoc(feature.meaning, feature.scale)
            for feature in (*spec.user_features, *spec.item_features)
            if feature.meaning or feature.scale
        },
        source=source,
    )


def parse_schema(raw: str, source: str = "<string>") -> FeatureSchema:
    try:
        spec = _SchemaFile.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise SchemaError(f"feature schema {source} is invalid: {exc}") from exc
    return _from_spec(spec, raw)


def load_schema(path: Path | None = None) -> FeatureSchema:
    """Load the schema file; without a path, the one shipped with the package."""
    if path is None:
        ref = resources.files("app.defaults").joinpath("feature_schema.json")
        return parse_schema(ref.read_text(encoding="utf-8"), "app/defaults/feature_schema.json")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"cannot read feature schema {path}: {exc}") from exc
    return parse_schema(raw, str(path))


# A model may also answer each head's probability, [n, len(HEAD_NAMES)], under this output
# name (rerank weighs them by the rules file's [objectives]); one that does not still serves.
HEADS_OUTPUT = "heads"
HEAD_NAMES = ("interact", "like")


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What Triton says the deployed model accepts, reduced to what the schema constrains."""

    name: str
    version: str
    input_name: str
    input_datatype: str
    input_shape: tuple[int, ...]
    output_name: str
    output_datatype: str
    max_batch_size: int
    world_id: str = ""  # the config's world_id parameter; empty for an unstamped model
    heads: bool = False  # whether it also answers HEADS_OUTPUT


def signature_mismatches(schema: FeatureSchema, signature: ModelSignature) -> list[str]:
    """Every way the deployed model disagrees with the schema; empty when they agree."""
    problems: list[str] = []
    if signature.input_name != schema.input_name:
        problems.append(
            f"input name is {signature.input_name!r}, schema says {schema.input_name!r}"
        )
    if signature.input_datatype != schema.datatype:
        problems.append(
            f"input datatype is {signature.input_datatype}, schema says {schema.datatype}"
        )
    width = signature.input_shape[-1] if signature.input_shape else "missing"
    if width != schema.width:
        problems.append(f"input width is {width}, schema packs {schema.width}")
    if signature.output_name != schema.output_name:
        problems.append(
            f"output name is {signature.output_name!r}, schema says {schema.output_name!r}"
        )
    if signature.output_datatype != schema.datatype:
        problems.append(
            f"output datatype is {signature.output_datatype}, schema says {schema.datatype}"
        )
    if signature.max_batch_size < 1:
        problems.append("model has no batch dimension (max_batch_size 0); rows cannot be batched")
    return problems


def world_schema(world: Path, explicit: Path | None) -> FeatureSchema:
    """The schema a world is served with: its own file, unless one is configured.

    A configured schema that disagrees with the world's own is refused: the world's tables,
    model and Redis blobs were all written in the world's layout.
    """
    own = world / SCHEMA_FILE
    if explicit is None:
        return load_schema(own if own.is_file() else None)
    schema = load_schema(explicit)
    if own.is_file() and load_schema(own) != schema:
        raise ConfigError(
            f"RECSYS_FEATURE_SCHEMA ({explicit}) differs from the world's own {own}: "
            "unset it to serve the world as built"
        )
    return schema
