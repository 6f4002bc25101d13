"""`recsys release world advance`: the world the last retrain accepted, staged and loaded as
the candidate, once.

    recsys release world advance --worlds /srv/recsys/worlds --redis-url redis://... \\
        --model-repository /srv/recsys/models --triton-url recsys-triton:8001 --percent 10

`recsys retrain` points --worlds/candidate at the world it accepted. Nothing happens, and
the sentence says why, when the service serves that world already, judges another
candidate (the new one waits for that verdict), or was given it before: a world loaded once
and rolled back since is not loaded again. Otherwise the world is staged (its keys into
Redis under recsys-ID, its model into Triton's repository as MODEL_ID, loaded at once by a
Triton in explicit model-control mode) and loaded beside the stable one for --percent of
users. Its id goes into --worlds/advanced.json once the service took it; a world the service
refused (a check failed, not enough memory) is tried again at the next run. Run on a timer
after the retrain (recsys-advance.timer), with the judge's timer acting on the verdict, the
loop needs nobody.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from app.core.atomic_files import write_atomically
from app.core.errors import ConfigError
from app.world.stamp import read_stamp
from recsys_tools.model.load import load_versions
from recsys_tools.retrain import CANDIDATE_LINK
from recsys_tools.worlds_client import call, candidate_names, said, stage

ADVANCED_FILE = "advanced.json"


@dataclass(frozen=True, slots=True)
class Advance:
    """Where the service is, and where it goes."""

    worlds: Path
    api_url: str
    token: str
    repository: Path
    triton_url: str
    percent: float = 10.0
    admin_key_env: str | None = None


def loaded_before(worlds: Path) -> dict[str, str]:
    """The worlds advanced once, by id, with when (UTC)."""
    try:
        record = json.loads((worlds / ADVANCED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    loaded = record.get("loaded", {}) if isinstance(record, dict) else {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def next_world(
    worlds: Path, state: dict[str, Any], before: dict[str, str]
) -> tuple[Path | None, str]:
    """The world to load now, or None and why not."""
    link = worlds / CANDIDATE_LINK
    if not link.exists():
        return None, f"no world accepted by a retrain yet ({link} is missing)"
    world = link.resolve()
    # The retrain writes its worlds under --worlds; a link that leads elsewhere would have
    # this job, which holds the loader's password and Triton's key, stage whatever is there.
    if not world.is_relative_to(worlds.resolve()):
        raise ConfigError(f"{link} leads to {world}, outside {worlds}: not a world a retrain wrote")
    stamp = read_stamp(world)
    if stamp is None:
        raise ConfigError(f"{world} carries no world id: not a world a retrain accepted")
    new = stamp.world_id
    if state["stable"] == new:
        return None, f"world {new} already answers every user"
    if state["candidate"] == new:
        return None, f"world {new} is the candidate already"
    if state["candidate"]:
        return None, f"world {state['candidate']} is being judged: {new} waits for its verdict"
    if new in before:
        return None, f"world {new} was loaded once ({before[new]} UTC) and rolled back: not again"
    return world, ""


def advance(plan: Advance, client: redis.Redis) -> str:
    """Stage and load the accepted world when its time has come; a sentence either way."""
    state = call(plan.api_url, plan.token, "show")
    before = loaded_before(plan.worlds)
    world, why = next_world(plan.worlds, state, before)
    if world is None:
        return f"Nothing to load: {why}."
    prefix, model = candidate_names(world)
    stage(world, client, plan.repository, prefix, model)
    load_versions(plan.triton_url, model, admin_key_env=plan.admin_key_env)
    body = {
        "artifacts_dir": str(world),
        "key_prefix": prefix,
        "model_name": model,
        "percent": plan.percent,
    }
    state = call(plan.api_url, plan.token, "candidate", body)
    before[state["candidate"]] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    write_atomically(plan.worlds / ADVANCED_FILE, json.dumps({"loaded": before}).encode())
    return f"Loaded: {said(state)}."
