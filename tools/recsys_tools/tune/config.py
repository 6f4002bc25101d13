"""The model config side of `recsys tune batching`: the settings swept, how each one edits
the config Triton serves, and the chosen one as config.pbtxt text."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import RecsysError


class TuneError(RecsysError):
    """Triton did not do what the sweep asked, or did something the sweep cannot measure."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One point of the sweep: what the dynamic batcher and the instance group are set to."""

    delay_us: int
    max_batch_size: int
    instances: int

    @property
    def label(self) -> str:
        return f"{self.delay_us}us/b{self.max_batch_size}/x{self.instances}"


def settings_grid(
    delays: Sequence[int], max_batch_sizes: Sequence[int], instances: Sequence[int]
) -> list[Setting]:
    """Every combination; the delay varies fastest, so a table reads as one sweep per block."""
    return [
        Setting(delay, size, count)
        for count, size, delay in itertools.product(instances, max_batch_sizes, delays)
    ]


def instance_count(config: Mapping[str, Any]) -> int:
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", []))


def loaded_setting(config: Mapping[str, Any]) -> Setting:
    """The setting a config (as Triton reports it, int64 fields as strings) describes."""
    batching = config.get("dynamic_batching") or {}
    return Setting(
        int(batching.get("max_queue_delay_microseconds", 0)),
        int(config.get("max_batch_size", 0)),
        instance_count(config),
    )


def with_setting(config: Mapping[str, Any], setting: Setting) -> dict[str, Any]:
    """A copy of the model config with the setting's delay, max_batch_size and instance count.

    Triton fills preferred_batch_size with max_batch_size when none is set and refuses one
    above it, so a preferred size equal to the old maximum follows the new one, and any left
    above the new maximum is dropped.
    """
    edited = copy.deepcopy(dict(config))
    old_max = int(edited.get("max_batch_size", 0))
    edited["max_batch_size"] = setting.max_batch_size
    batching = edited.setdefault("dynamic_batching", {})
    batching["max_queue_delay_microseconds"] = setting.delay_us
    preferred = {
        setting.max_batch_size if int(size) == old_max else int(size)
        for size in batching.get("preferred_batch_size", [])
    }
    kept = sorted(size for size in preferred if size <= setting.max_batch_size)
    if kept:
        batching["preferred_batch_size"] = kept
    else:
        batching.pop("preferred_batch_size", None)
    if setting.instances != instance_count(edited):
        groups = edited.get("instance_group", [])
        if len(groups) != 1:
            raise TuneError(
                f"the model has {len(groups)} instance groups; --instances sets the count of "
                "one: leave --instances out for this model"
            )
        groups[0]["count"] = setting.instances
    return edited


def config_text(config: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """The config as config.pbtxt text, through Triton's own ModelConfig message."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        message = json_format.ParseDict(dict(config), model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise TuneError(
            f"the model config does not fit tritonclient's ModelConfig ({exc}): install the "
            "tritonclient of the server's release"
        ) from None
    comments = "".join(f"# {line}\n" for line in header)
    return comments + str(text_format.MessageToString(message))
