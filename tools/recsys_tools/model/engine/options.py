"""What the operator may ask of a build, with defaults read from the deployment's own files.

The serving image, the engine cache volume and the source config default to what production
runs, so a build with no flags makes the engine for the service as deployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from recsys_tools.model.engine.calibration import CALIBRATION_ROWS
from recsys_tools.model.engine.profile import REQUEST_ROWS

ENGINES = ("ort-trt", "plan")
PRECISIONS = ("fp16", "fp32", "int8")
DEFAULT_CONFIG = Path("deploy/triton/gpu/ranking_model/config.pbtxt")
TRITON_QUADLET = Path("deploy/quadlet/recsys-triton.container")
CACHE_QUADLET = Path("deploy/quadlet/recsys-trt-cache.volume")
DEFAULT_CACHE_VOLUME = "recsys-trt-cache"


@dataclass(frozen=True, slots=True)
class BuildOptions:
    world: Path
    config: Path
    out: Path
    triton_image: str
    precision: str = "fp16"
    engine: str = "ort-trt"
    calibration_rows: int = CALIBRATION_ROWS
    request_rows: int = REQUEST_ROWS
    cache_volume: str = DEFAULT_CACHE_VOLUME
    dry_run: bool = False


def quadlet_value(path: Path, key: str) -> str | None:
    """The value of `key=` in a quadlet unit, None when the file or the key is absent."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None


def shown(path: Path) -> str:
    """A path as short as it can be said from here, for messages."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
