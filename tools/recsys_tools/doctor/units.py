"""The systemd unit that runs Triton: the quadlet (or the plain unit) and its drop-ins."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recsys_tools.doctor.host import Host, LocalHost

TRITON_QUADLET = "recsys-triton.container"
TRITON_SERVICE = "recsys-triton.service"  # what systemd calls it, quadlet or plain unit
QUADLET_DIR = "/etc/containers/systemd"
SYSTEMD_DIR = "/etc/systemd/system"

_TRITON_IMAGE = re.compile(r"nvcr\.io/nvidia/tritonserver:(\d{2})\.(\d{2})\S*")
_GPU_DEVICE = re.compile(r"nvidia\.com/gpu=(\S+)")


@dataclass(frozen=True, slots=True)
class UnitFile:
    path: str
    text: str


@dataclass(frozen=True, slots=True)
class Place:
    """A directory that may hold the Triton unit, and the host that reads it."""

    host: Host
    directory: str


@dataclass(frozen=True, slots=True)
class TritonUnit:
    unit: UnitFile
    dropins: tuple[UnitFile, ...] = ()

    @property
    def files(self) -> tuple[UnitFile, ...]:
        return (self.unit, *self.dropins)

    @property
    def path(self) -> str:
        return self.unit.path


def checkout_quadlet_dir() -> Path | None:
    """deploy/quadlet of the checkout this package runs from, if it does run from one."""
    root = Path(__file__).resolve().parents[3]
    directory = root / "deploy" / "quadlet"
    if (root / "tools" / "recsys_tools").is_dir() and directory.is_dir():
        return directory
    return None


def unit_places(host: Host, units: Path | None) -> list[Place]:
    """Where to look: --units as given on this machine; else the host's unit directories
    (under --root), then this checkout's deploy/quadlet."""
    if units is not None:
        return [Place(LocalHost(), str(units.absolute()))]
    places = [Place(host, QUADLET_DIR), Place(host, SYSTEMD_DIR)]
    checkout = checkout_quadlet_dir()
    if checkout is not None:
        places.append(Place(LocalHost(), str(checkout)))
    return places


def _dropins(host: Host, directory: str, name: str) -> list[UnitFile]:
    found: list[UnitFile] = []
    for path in host.glob(f"{directory.rstrip('/')}/{name}.d/*.conf"):
        text = host.read(path)
        if text is not None:
            found.append(UnitFile(path, text))
    return found


def load_triton_unit(host: Host, places: list[Place]) -> TritonUnit | None:
    """The first recsys-triton.container or .service found, with its drop-ins: those next to
    it and the host's /etc/systemd/system/recsys-triton.service.d (both apply to the service).
    """
    for place in places:
        for name in (TRITON_QUADLET, TRITON_SERVICE):
            path = f"{place.directory.rstrip('/')}/{name}"
            text = place.host.read(path)
            if text is None:
                continue
            dropins = _dropins(place.host, place.directory, name)
            seen = {d.path for d in dropins}
            dropins += [
                d for d in _dropins(host, SYSTEMD_DIR, TRITON_SERVICE) if d.path not in seen
            ]
            return TritonUnit(UnitFile(path, text), tuple(dropins))
    return None


def describe_places(places: list[Place]) -> str:
    return ", ".join(p.directory for p in places)


def logical_lines(text: str) -> list[str]:
    """Unit-file lines with comments dropped and backslash continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped[0] in "#;"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending.strip())
    return lines


def triton_image(unit: TritonUnit) -> tuple[str, tuple[int, int]] | None:
    """The tritonserver image the unit runs and its release (year, month)."""
    for file in unit.files:
        lines = logical_lines(file.text)
        # Image= (a quadlet) wins over a mention in a command line (a plain unit).
        for line in sorted(lines, key=lambda line: not line.startswith("Image=")):
            match = _TRITON_IMAGE.search(line)
            if match:
                return match.group(0), (int(match.group(1)), int(match.group(2)))
    return None


def gpu_index(unit: TritonUnit) -> int:
    """The host GPU that is the container's GPU 0 (where the model's instances run):
    nvidia.com/gpu=N names it; `all` (or a UUID, which only nvidia-smi maps) means GPU 0."""
    for file in unit.files:
        for line in logical_lines(file.text):
            match = _GPU_DEVICE.search(line)
            if match and match.group(1).isdigit():
                return int(match.group(1))
    return 0
