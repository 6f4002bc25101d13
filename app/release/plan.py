"""Which model versions answer whom: the stable one, a canary for a share of users, a shadow.

The release file (RECSYS_RELEASE_FILE, TOML) is what a reload reads; without one the stable
version is RECSYS_MODEL_VERSION and there is no canary or shadow:

    [model]
    stable = ""            # "" = the latest version Triton has ready
    canary = "2"           # a version to try on a share of users; "" = none
    canary_percent = 10.0  # that share, 0-100, by a stable hash of the user id
    shadow = ""            # scored beside the answer, never changing it; "" = none

A user's share is a hash of the user id, not a coin flip per request, so a user sees one
model throughout a canary, and raising the percentage only adds users to it.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.core.vocabulary import Heads, Scores, Variant
from app.world.schema import ModelSignature

_BUCKETS = 10_000  # shares are resolved to 0.01%


@dataclass(frozen=True, slots=True)
class ReleasePlan:
    """The versions asked for, as written: "" means the latest ready version."""

    stable: str = ""
    canary: str = ""
    canary_percent: float = 0.0
    shadow: str = ""

    def without_trials(self) -> ReleasePlan:
        """The rollback: the stable version alone."""
        return ReleasePlan(stable=self.stable)


@dataclass(frozen=True, slots=True)
class Routed:
    """One version as requests ask Triton for it, and what Triton said it accepts."""

    version: str  # sent with every inference; "" lets Triton pick its latest
    signature: ModelSignature


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    scores: Scores
    version: str  # the version Triton says computed them
    heads: Heads | None = None  # where the model answers its heads too


@dataclass(frozen=True, slots=True)
class ModelRouting:
    stable: Routed
    canary: Routed | None = None
    canary_percent: float = 0.0
    shadow: Routed | None = None

    def named(self) -> list[tuple[str, Routed]]:
        """Every version routed, by role: the stable one, then the canary and the shadow."""
        roles = (("stable", self.stable), ("canary", self.canary), ("shadow", self.shadow))
        return [(role, each) for role, each in roles if each is not None]

    def routed(self) -> list[Routed]:
        return [each for _, each in self.named()]

    def signatures(self) -> list[ModelSignature]:
        return [each.signature for each in self.routed()]

    def pick(self, user_id: str) -> tuple[Variant, Routed]:
        if self.canary is not None and in_share(user_id, self.canary_percent):
            return Variant.CANARY, self.canary
        return Variant.STABLE, self.stable


def user_bucket(user_id: str) -> int:
    """The user's place in 0..9999, the same in every process and release."""
    digest = hashlib.blake2b(user_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _BUCKETS


def in_share(user_id: str, percent: float) -> bool:
    return user_bucket(user_id) < round(percent * _BUCKETS / 100.0)


def _text(table: dict[str, Any], key: str, path: Path) -> str:
    value = table.get(key, "")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or (value and not value.isdigit()):
        raise ConfigError(f'{path}: model.{key} must be a version number, or "" for none')
    return value


def _percent(table: dict[str, Any], path: Path) -> float:
    value = table.get("canary_percent", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ConfigError(f"{path}: model.canary_percent must be a number from 0 to 100")
    return float(value)


def read_plan(path: Path | None, default_stable: str) -> ReleasePlan:
    """The release file's plan; without a file, `default_stable` alone."""
    if path is None:
        return ReleasePlan(stable=default_stable)
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"release file {path} is not readable TOML: {exc}") from None
    table = document.get("model", {})
    unknown = sorted(set(document) - {"model"}) + sorted(
        set(table) - {"stable", "canary", "canary_percent", "shadow"}
    )
    if not isinstance(table, dict) or unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; see docs/changing-what-serves.md")
    plan = ReleasePlan(
        stable=_text(table, "stable", path),
        canary=_text(table, "canary", path),
        canary_percent=_percent(table, path),
        shadow=_text(table, "shadow", path),
    )
    if plan.canary and plan.canary == plan.stable:
        raise ConfigError(f"{path}: the canary is the stable version {plan.stable}")
    return plan


def write_plan(path: Path, plan: ReleasePlan) -> None:
    """Replace the file whole and durably: no reader, and no crash, leaves half of it."""
    text = (
        "[model]\n"
        f'stable = "{plan.stable}"\n'
        f'canary = "{plan.canary}"\n'
        f"canary_percent = {plan.canary_percent}\n"
        f'shadow = "{plan.shadow}"\n'
    )
    write_atomically(path, text.encode())
