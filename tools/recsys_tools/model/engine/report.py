"""One record of a build, rendered for the operator (text) and for scripts (JSON).

Both renderings come from the same record, so what a script reads is what the operator saw.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from recsys_tools.model.engine.commands import CHECK_CONTAINER, Command
from recsys_tools.model.engine.profile import Profile
from recsys_tools.model.engine.release import ImageRelease


@dataclass(slots=True)
class EngineReport:
    world: str
    config: str
    out: str
    model: str
    engine: str
    precision: str
    release: ImageRelease
    profile: Profile
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    dry_run: str | None = None  # why the build commands were not run; None when they ran
    timings_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        report["profile"] = asdict(self.profile) | {"shapes": self.profile.shapes}
        report["commands"] = [asdict(c) | {"shell": c.shell} for c in self.commands]
        return report


def render_text(report: EngineReport) -> str:
    shapes = ", ".join(f"{k} {v}" for k, v in report.profile.shapes.items())
    lines = [
        f"{report.model} from {report.world}: {report.engine}, {report.precision.upper()}, "
        f"serving image {report.release.triton_image} (release {report.release.release})",
        f"profile: {shapes}",
        "checks passed:",
        *(f"  - {check}" for check in report.checks),
        "notes:",
        *(f"  - {note}" for note in report.notes),
        "files written:",
        *(f"  {path}" for path in report.files),
    ]
    ran = "dry run: " + report.dry_run if report.dry_run else "build commands ran"
    lines.append(f"commands ({ran}):")
    for command in report.commands:
        lines += [f"  # {command.stage}: {command.purpose}", f"  {command.shell}"]
    lines += [f"{purpose}: {seconds:.1f} s" for purpose, seconds in report.timings_s.items()]
    if report.dry_run is None and report.engine == "ort-trt":
        lines.append(
            f"{CHECK_CONTAINER} is left running for the verify commands; the last stops it"
        )
    return "\n".join(lines)
