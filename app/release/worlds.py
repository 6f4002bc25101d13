"""The worlds file: which world is stable, which (if any) is the candidate, and its share.

A world is its files (`artifacts_dir`), its keys in Redis (`key_prefix`) and its model on
Triton (`model_name`); two worlds differ in all three. The file is the one truth every worker
converges to (an /admin call writes it, then signals the others), and it outlives a restart:
a promoted world stays stable after one. With no file, or no `[stable]` in it, the stable
world is the one the settings name.

    [stable]                       # written by a promotion
    artifacts_dir = "/var/lib/recsys/worlds/2026-12-03"
    key_prefix = "recsys-20261203"
    model_name = "ranking_model_20261203"

    [candidate]
    artifacts_dir = "/var/lib/recsys/worlds/2026-12-04"
    key_prefix = "recsys-20261204"
    model_name = "ranking_model_20261204"
    percent = 10.0                 # that share of users, by a stable hash of the user id

A user's world is a hash of the user id salted apart from the model canary's, so the
candidate's share and a model canary's share are drawn independently.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.core.settings import Settings
from app.release.plan import in_share
from app.world.schema import checked_name

_SALT = "world:"
_KEYS = {"artifacts_dir", "key_prefix", "model_name"}


@dataclass(frozen=True, slots=True)
class WorldRef:
    artifacts_dir: Path
    key_prefix: str
    # None: the model the world's schema names.
    model_name: str | None = None

    def said(self) -> str:
        model = self.model_name or "its schema's model"
        return f"{self.artifacts_dir} (keys {self.key_prefix}:*, model {model})"


@dataclass(frozen=True, slots=True)
class WorldsPlan:
    stable: WorldRef | None = None
    candidate: WorldRef | None = None
    percent: float = 0.0

    def with_candidate(self, candidate: WorldRef | None, percent: float = 0.0) -> WorldsPlan:
        return replace(self, candidate=candidate, percent=percent if candidate else 0.0)

    def promoted(self) -> WorldsPlan:
        """The candidate made stable, for everyone."""
        if self.candidate is None:
            raise ConfigError("there is no candidate world to promote")
        return WorldsPlan(stable=self.candidate)


def candidate_user(user_id: str, percent: float) -> bool:
    """Whether this user is in the candidate world's share: the same in every process."""
    return in_share(_SALT + user_id, percent)


def _ref(table: object, name: str, path: Path) -> WorldRef:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{name}] must be a table")
    unknown = sorted(set(table) - _KEYS - ({"percent"} if name == "candidate" else set()))
    if unknown:
        raise ConfigError(f"{path}: [{name}] has unknown keys {unknown}")
    artifacts, prefix = table.get("artifacts_dir"), table.get("key_prefix")
    model = table.get("model_name")
    if not isinstance(artifacts, str) or not artifacts:
        raise ConfigError(f"{path}: [{name}] artifacts_dir must name the world's directory")
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        raise ConfigError(f"{path}: [{name}] key_prefix must be a Redis key prefix, no braces")
    if model is not None:
        model = checked_name(model, f"{path}: [{name}] model_name")
    return WorldRef(Path(artifacts), prefix, model)


def _percent(table: dict[str, Any], path: Path) -> float:
    value = table.get("percent", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ConfigError(f"{path}: [candidate] percent must be a number from 0 to 100")
    return float(value)


def read_worlds(path: Path | None) -> WorldsPlan:
    """The file's plan; no setting, or no file yet: the settings' world alone."""
    if path is None or not path.exists():
        return WorldsPlan()
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"worlds file {path} is not readable TOML: {exc}") from None
    unknown = sorted(set(document) - {"stable", "candidate"})
    if unknown:
        raise ConfigError(f"{path}: unknown tables {unknown}; see docs/loop.md")
    stable = _ref(document["stable"], "stable", path) if "stable" in document else None
    if "candidate" not in document:
        return WorldsPlan(stable)
    candidate = _ref(document["candidate"], "candidate", path)
    return WorldsPlan(stable, candidate, _percent(document["candidate"], path))


def _table(name: str, ref: WorldRef, extra: str = "") -> str:
    # A JSON string is a TOML basic string: quotes and backslashes in a path survive.
    model = f"model_name = {json.dumps(ref.model_name)}\n" if ref.model_name else ""
    return (
        f"[{name}]\n"
        f"artifacts_dir = {json.dumps(str(ref.artifacts_dir))}\n"
        f"key_prefix = {json.dumps(ref.key_prefix)}\n"
        f"{model}{extra}"
    )


def write_worlds(path: Path, plan: WorldsPlan) -> None:
    """Replace the file whole and durably: no reader, and no crash, leaves half of it."""
    parts = []
    if plan.stable is not None:
        parts.append(_table("stable", plan.stable))
    if plan.candidate is not None:
        parts.append(_table("candidate", plan.candidate, f"percent = {plan.percent}\n"))
    write_atomically(path, "\n".join(parts).encode())


def world_settings(base: Settings, ref: WorldRef | None) -> Settings:
    """The settings that serve `ref`; None: the base settings' own world.

    A world from the worlds file keeps the base's event streams (every world reads the one
    event log, each with its own consumer group) and serves its model's configured version:
    the release file's model versions are the base world's model's.
    """
    if ref is None:
        return base
    if ref.model_name is not None:
        # The file's names are checked as it is read; /admin's come this way too.
        checked_name(ref.model_name, f"world {ref.artifacts_dir}'s model_name")
    return base.model_copy(
        update={
            "artifacts_dir": ref.artifacts_dir,
            "redis_key_prefix": ref.key_prefix,
            "model_name": ref.model_name,
            "event_key_prefix": base.event_key_prefix or base.redis_key_prefix,
            "release_file": None,
            "fallback_model": None,
        }
    )
