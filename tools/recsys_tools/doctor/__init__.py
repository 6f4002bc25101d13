"""`recsys doctor`: checks a RHEL 8 GPU host for the known pitfalls of running Triton under
Podman (nouveau, driver/library mismatch, Secure Boot, SELinux, CDI, Podman, CUDA version,
NUMA, overcommit) and the services (Triton's model, Redis's layout) against the schema."""

from recsys_tools.doctor.command import add_doctor_options, register, run_doctor
from recsys_tools.doctor.findings import Check, CheckOutcome, Finding, Status, run_checks
from recsys_tools.doctor.host import CommandTimeoutError, Host, LocalHost

__all__ = [
    "Check",
    "CheckOutcome",
    "CommandTimeoutError",
    "Finding",
    "Host",
    "LocalHost",
    "Status",
    "add_doctor_options",
    "register",
    "run_checks",
    "run_doctor",
]
