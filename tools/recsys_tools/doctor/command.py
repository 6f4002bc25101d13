"""`recsys doctor`: the options, the list of checks, the report and the exit status."""

from __future__ import annotations

import argparse
import sys
from functools import cache
from pathlib import Path
from typing import TextIO

from app.core.settings import Settings
from app.world.schema import load_schema
from recsys_tools.commands import Commands
from recsys_tools.doctor.checks import (
    check_cdi_spec,
    check_image_pins,
    check_nouveau,
    check_nvidia_driver,
    check_overcommit,
    check_podman,
    check_secure_boot,
    check_selinux,
)
from recsys_tools.doctor.cuda import check_cuda_for_triton
from recsys_tools.doctor.findings import (
    Check,
    exit_status,
    fail,
    render_json,
    render_text,
    run_checks,
)
from recsys_tools.doctor.host import Host, LocalHost
from recsys_tools.doctor.numa import check_numa
from recsys_tools.doctor.services import (
    ServiceConfig,
    check_redis,
    check_redis_memory,
    check_triton,
)
from recsys_tools.doctor.units import (
    TritonUnit,
    describe_places,
    load_triton_unit,
    unit_places,
)


def register(commands: Commands) -> None:
    doctor = commands.add_parser(
        "doctor", help="check this GPU host (driver, SELinux, CDI, NUMA, ...) and the services"
    )
    add_doctor_options(doctor)
    doctor.set_defaults(run=_doctor)


def _doctor(args: argparse.Namespace) -> None:
    status = run_doctor(args)
    if status:
        raise SystemExit(status)


def add_doctor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read every host file (/proc, /sys, /etc) under this directory (default /)",
    )
    parser.add_argument(
        "--units",
        type=Path,
        default=None,
        help="directory holding recsys-triton.container (default: /etc/containers/systemd "
        "under --root, then this checkout's deploy/quadlet)",
    )
    parser.add_argument("--redis-url", default=None, help="default: RECSYS_REDIS_URL")
    parser.add_argument("--triton-url", default=None, help="default: RECSYS_TRITON_URL")
    parser.add_argument(
        "--model-name", default=None, help="default: RECSYS_MODEL_NAME, else the schema's"
    )
    parser.add_argument(
        "--skip-services", action="store_true", help="host checks only: not Triton nor Redis"
    )


def host_checks(host: Host, units: Path | None) -> list[Check]:
    places = unit_places(host, units)

    @cache
    def unit() -> TritonUnit | None:
        return load_triton_unit(host, places)

    looked_in = describe_places(places)

    return [
        Check("nouveau", lambda: check_nouveau(host)),
        Check("nvidia-driver", lambda: check_nvidia_driver(host)),
        Check("secure-boot", lambda: check_secure_boot(host)),
        Check("selinux", lambda: check_selinux(host)),
        Check("cdi-spec", lambda: check_cdi_spec(host)),
        Check("podman", lambda: check_podman(host)),
        Check("cuda-for-triton", lambda: check_cuda_for_triton(host, unit(), looked_in)),
        Check("numa", lambda: check_numa(host, unit(), looked_in)),
        Check("overcommit", lambda: check_overcommit(host)),
        Check("image-pins", lambda: check_image_pins(host)),
    ]


def service_checks(args: argparse.Namespace) -> list[Check]:
    """Triton and Redis, configured like the service (RECSYS_*), options first."""
    try:
        settings = Settings()
        schema = load_schema(settings.feature_schema)
        config = ServiceConfig(
            redis_url=args.redis_url or settings.redis_url,
            key_prefix=settings.redis_key_prefix,
            triton_url=args.triton_url or settings.triton_url,
            model_name=args.model_name or settings.model_name or schema.model_name,
            model_version=settings.model_version,
            schema=schema,
            event_partitions=settings.event_partitions,
            event_stream_max=settings.event_stream_max,
            max_body_bytes=settings.max_body_bytes,
        )
    except Exception as exc:
        reason = fail(
            f"cannot configure the service checks: {type(exc).__name__}: {exc}",
            "fix the RECSYS_* variable or the feature schema it names",
        )
        return [Check("triton", lambda: reason), Check("redis", lambda: reason)]
    return [
        Check("triton", lambda: check_triton(config)),
        Check("redis", lambda: check_redis(config)),
        Check("redis-memory", lambda: check_redis_memory(config)),
    ]


def run_doctor(
    args: argparse.Namespace, host: Host | None = None, out: TextIO | None = None
) -> int:
    """Run every check, print the report, return the exit status (1 when anything failed)."""
    host = host if host is not None else LocalHost(args.root)
    checks = host_checks(host, args.units)
    if not args.skip_services:
        checks += service_checks(args)
    findings = run_checks(checks)
    stream = out if out is not None else sys.stdout
    print(render_json(findings) if args.json else render_text(findings), file=stream)
    return exit_status(findings)
