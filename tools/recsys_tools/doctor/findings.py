"""What a check says (ok / warn / fail, a finding, a remedy) and how the report prints."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from recsys_tools.doctor.host import CommandTimeoutError


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """One check's verdict: the finding in a line, and for warn/fail what to do about it."""

    status: Status
    finding: str
    remedy: str | None = None


def ok(finding: str) -> CheckOutcome:
    return CheckOutcome(Status.OK, finding)


def warn(finding: str, remedy: str) -> CheckOutcome:
    return CheckOutcome(Status.WARN, finding, remedy)


def fail(finding: str, remedy: str) -> CheckOutcome:
    return CheckOutcome(Status.FAIL, finding, remedy)


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    finding: str
    remedy: str | None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "check": self.check,
            "status": self.status.value,
            "finding": self.finding,
            "remedy": self.remedy,
        }


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    run: Callable[[], CheckOutcome]


def _crashed(exc: Exception) -> CheckOutcome:
    if isinstance(exc, CommandTimeoutError):
        return fail(
            str(exc),
            "run it by hand; an nvidia-smi that hangs is a stuck driver: "
            "journalctl -k | grep -iE 'nvrm|xid', then reboot",
        )
    return fail(
        f"the check could not run: {type(exc).__name__}: {exc}",
        "run the command or read the file it names by hand; report the message if it persists",
    )


def run_checks(checks: Iterable[Check]) -> list[Finding]:
    """Every check runs; one that raises is reported as failed with the reason."""
    findings: list[Finding] = []
    for check in checks:
        try:
            outcome = check.run()
        except Exception as exc:
            outcome = _crashed(exc)
        remedy = None if outcome.status is Status.OK or outcome.remedy is None else outcome.remedy
        findings.append(
            Finding(
                check.name,
                outcome.status,
                _one_line(outcome.finding),
                None if remedy is None else _one_line(remedy),
            )
        )
    return findings


def exit_status(findings: Sequence[Finding]) -> int:
    """1 when anything failed; warnings alone do not fail."""
    return 1 if any(f.status is Status.FAIL for f in findings) else 0


def summary(findings: Sequence[Finding]) -> dict[str, object]:
    """The verdict first: the worst status, counts, and the checks to read."""
    counts = {status.value: sum(f.status is status for f in findings) for status in Status}
    worst = next((s for s in (Status.FAIL, Status.WARN) if counts[s.value]), Status.OK).value
    return {
        "status": worst,
        "exit_status": exit_status(findings),
        "checks": len(findings),
        **counts,
        "failed": [f.check for f in findings if f.status is Status.FAIL],
        "warned": [f.check for f in findings if f.status is Status.WARN],
    }


def render_json(findings: Sequence[Finding]) -> str:
    """{"summary": {...}, "findings": [...]}: a monitor reads one object, not a list."""
    report = {"summary": summary(findings), "findings": [f.as_dict() for f in findings]}
    return json.dumps(report, indent=2)


def render_text(findings: Sequence[Finding]) -> str:
    width = max((len(f.check) for f in findings), default=0)
    lines: list[str] = []
    for f in findings:
        lines.append(f"{f.status.value:<4}  {f.check:<{width}}  {f.finding}")
        if f.remedy:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {f.remedy}")
    counts = {status: sum(f.status is status for f in findings) for status in Status}
    lines.append(
        f"{counts[Status.FAIL]} failed, {counts[Status.WARN]} warned, {counts[Status.OK]} ok"
    )
    return "\n".join(lines)
