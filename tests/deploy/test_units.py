"""The systemd units in deploy/: Podman's own quadlet generator, then systemd-analyze verify.

The quadlets (deploy/quadlet) go through the real generator, taken from Debian's podman
package (deploy/tools/fetch-deb, cached under var/tools). The units it writes and the plain
units (deploy/systemd) are then checked by `systemd-analyze verify`, which must print nothing
at all: it reports bad values with exit status 0. It runs against a scratch root holding what
the units reference (/usr/bin/podman: the fetched binary; /bin/sh; the systemd targets they
depend on), so nothing on this machine needs Podman installed and no output is filtered.
Last, the properties that matter are read back from the units podman would run.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from app.process.reload import RELOAD_SIGNAL
from tests.debian_tools import debian_root

ROOT = Path(__file__).resolve().parents[2]
QUADLET_DIR = ROOT / "deploy" / "quadlet"
PLAIN_DIR = ROOT / "deploy" / "systemd"
HEALTH_CHECK = QUADLET_DIR / "triton-model-ready.py"

CONTAINERS = (
    "recsys-triton",
    "recsys-redis",
    "recsys-api",
    "recsys-ingest",
    "recsys-archive",
    "recsys-prometheus",
    "recsys-grafana",
)
# Containers a timer starts, that run to their end: not wanted at boot.
JOBS = ("recsys-retrain", "recsys-judge", "recsys-advance")
HOST_ENV = ROOT / "deploy" / "host.env"
# Registry images: named by tag, pinned by the digest host.env holds for each.
PINNED = {
    "recsys-triton": ("nvcr.io/nvidia/tritonserver:26.10-py3", "RECSYS_TRITON_PIN"),
    "recsys-redis": ("docker.io/library/redis:7.2.16", "RECSYS_REDIS_PIN"),
    "recsys-prometheus": ("quay.io/prometheus/prometheus:v3.5.0", "RECSYS_PROMETHEUS_PIN"),
    "recsys-grafana": ("docker.io/grafana/grafana:12.1.1", "RECSYS_GRAFANA_PIN"),
}
TRITON_IMAGE = PINNED["recsys-triton"][0] + "${RECSYS_TRITON_PIN}"
# The gRPC protocols Triton answers only with its admin key: all but what the API uses.
RESTRICTED = "model-repository,shared-memory,statistics,trace,logging"
# The targets the units depend on, implicitly (DefaultDependencies) or by name.
TARGETS = (
    "sysinit.target",
    "basic.target",
    "shutdown.target",
    "network-online.target",
    "multi-user.target",
    "timers.target",
)
# podman run options that take no value; every other option takes one.
RUN_FLAGS = {"--rm", "--replace", "-d", "--detach", "--read-only"}
ALIASES = {"-v": "--volume", "-p": "--publish", "-d": "--detach", "-e": "--env", "-u": "--user"}


# Fetching, generating and verifying --------------------------------------------------------


def fetch_podman() -> Path:
    """Debian trixie's podman package unpacked (podman 5: this Debian's 4.3 has no quadlet)."""
    return debian_root("trixie", "podman")


@pytest.fixture(scope="session")
def podman_root() -> Path:
    return fetch_podman()


def run_quadlet(podman_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(podman_root / "usr" / "libexec" / "podman" / "quadlet"), "-no-kmsg-log", *args],
        env={**os.environ, "QUADLET_UNIT_DIRS": str(QUADLET_DIR)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="session")
def generated(podman_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the generator writes for deploy/quadlet (as systemd runs it at daemon-reload)."""
    out = tmp_path_factory.mktemp("quadlet-units")
    result = run_quadlet(podman_root, str(out))
    if result.returncode != 0 or result.stdout or result.stderr:
        pytest.fail(f"quadlet failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return out


def quadlet_sources() -> list[Path]:
    return sorted(
        path
        for path in QUADLET_DIR.iterdir()
        if path.suffix in (".container", ".volume", ".network")
    )


def expected_service(source: Path) -> str:
    if source.suffix == ".container":
        return f"{source.stem}.service"
    return f"{source.stem}-{source.suffix[1:]}.service"


def host_unit_dir() -> Path:
    for candidate in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if (candidate / "sysinit.target").exists():
            return candidate
    pytest.fail("no systemd unit directory with sysinit.target on this machine")


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is not installed (Debian: the systemd package)")
    return found


def link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def scratch_root(base: Path, podman: Path, units: Iterable[Path]) -> Path:
    """A root file system holding what the units reference, laid out like RHEL 8's.

    systemd-analyze verify --root resolves every path in the units under it: the executables
    (/usr/bin/podman is the fetched podman binary; /bin is /usr/bin, as on RHEL, for /bin/sh),
    the targets the units depend on (this machine's own), and the units, in /etc/systemd/system.
    """
    (base / "usr" / "bin").mkdir(parents=True)
    link_or_copy(podman, base / "usr" / "bin" / "podman")
    for tool in ("sh", "install"):
        found = shutil.which(tool)
        assert found is not None, tool
        shutil.copy2(Path(found).resolve(), base / "usr" / "bin" / tool)
    (base / "bin").symlink_to("usr/bin")
    targets = base / "usr" / "lib" / "systemd" / "system"
    targets.mkdir(parents=True)
    for name in TARGETS:
        shutil.copy2(host_unit_dir() / name, targets / name)
    etc = base / "etc" / "systemd" / "system"
    etc.mkdir(parents=True)
    for unit in units:
        if unit.is_dir():
            shutil.copytree(unit, etc / unit.name)
        else:
            shutil.copy2(unit, etc / unit.name)
    return base


def verify(root: Path, names: Iterable[str]) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify on units of the scratch root, by name."""
    return subprocess.run(
        [systemd_analyze(), "verify", f"--root={root}", *names],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        timeout=60,
    )


def assert_quiet(result: subprocess.CompletedProcess[str]) -> None:
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


# The units, read back ----------------------------------------------------------------------

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections, each key with all its values in order (continuation lines joined)."""
    sections: Unit = {}
    current: dict[str, list[str]] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert values, f"no {key}= in [{section}]"
    return values[-1]


def words(unit: Unit, section: str, key: str) -> list[str]:
    return [word for value in unit.get(section, {}).get(key, []) for word in value.split()]


def seconds(span: str) -> float:
    """A systemd time span such as 30, 30s, 15min or 1min 30s."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    parts = re.findall(r"(\d+)\s*([a-z]*)", span)
    assert parts, span
    assert "".join(n + u for n, u in parts) == span.replace(" ", ""), span
    return float(sum(int(n) * units[u] for n, u in parts))


@dataclass
class PodmanRun:
    """One `podman run` command line: its options, the image and the container's command."""

    options: list[tuple[str, str]]
    image: str
    command: list[str]

    @classmethod
    def parse(cls, exec_start: str) -> PodmanRun:
        argv = shlex.split(exec_start)
        assert argv[0] == "/usr/bin/podman", argv
        assert argv[1] == "run", argv
        options: list[tuple[str, str]] = []
        rest = argv[2:]
        while rest and rest[0].startswith("-"):
            word = rest.pop(0)
            name, equals, value = word.partition("=")
            if not equals and word not in RUN_FLAGS:
                value = rest.pop(0)
            options.append((ALIASES.get(name, name), value))
        return cls(options, rest[0], rest[1:])

    def values(self, name: str) -> list[str]:
        return [value for option, value in self.options if option == name]

    def value(self, name: str) -> str:
        found = self.values(name)
        assert len(found) == 1, f"{name}: {found}"
        return found[0]

    def has(self, name: str) -> bool:
        return any(option == name for option, _ in self.options)


def read_units(directory: Path) -> dict[str, Unit]:
    return {path.stem: parse_unit(path.read_text()) for path in sorted(directory.glob("*.service"))}


@pytest.fixture(params=["quadlet", "plain"])
def units(request: pytest.FixtureRequest) -> dict[str, Unit]:
    """The container services: the generator's, then the plain units'."""
    if request.param == "quadlet":
        directory: Path = request.getfixturevalue("generated")
        return read_units(directory)
    return read_units(PLAIN_DIR)


def podman_run(units: dict[str, Unit], name: str) -> PodmanRun:
    return PodmanRun.parse(one(units[name], "Service", "ExecStart"))


def volume(run: PodmanRun, target: str) -> tuple[str, set[str]]:
    """The source and the options of the volume mounted at target."""
    for spec in run.values("--volume"):
        source, dest, *options = spec.split(":")
        if dest == target:
            return source, set(",".join(options).split(",")) - {""}
    raise AssertionError(f"nothing mounted at {target}: {run.values('--volume')}")


def test_a_host_folder_two_containers_mount_is_labelled_shared(units: dict[str, Unit]) -> None:
    """Under SELinux `Z` relabels a folder private to one container: a second container
    mounting it would lose it (or take it away) at its next start. Shared ones take `z`."""
    labels: dict[str, dict[str, set[str]]] = {}
    for name in (*CONTAINERS, *JOBS):
        run = podman_run(units, name)
        for spec in run.values("--volume"):
            source, _, *options = spec.split(":")
            if source.startswith("/"):
                labels.setdefault(source, {})[name] = set(",".join(options).split(","))
    shared = {source: users for source, users in labels.items() if len(users) > 1}
    assert {"/srv/recsys/worlds", "/srv/recsys/release", "/srv/recsys/archive"} <= set(shared)
    for source, users in shared.items():
        for name, labelled in users.items():
            assert "z" in labelled, (source, name, labelled)
            assert "Z" not in labelled, (source, name, labelled)


# The generator -----------------------------------------------------------------------------


def test_quadlet_makes_one_service_per_container_volume_and_network(generated: Path) -> None:
    expected = {expected_service(source) for source in quadlet_sources()}
    assert {path.name for path in generated.glob("*.service")} == expected
    assert len(expected) == 16  # seven containers, three jobs, four volumes, two networks
    wants = generated / "multi-user.target.wants"
    assert {path.name for path in wants.iterdir()} == {f"{name}.service" for name in CONTAINERS}


def test_quadlet_dry_run_prints_the_same_units(podman_root: Path, generated: Path) -> None:
    result = run_quadlet(podman_root, "-dryrun")
    assert result.returncode == 0, result.stderr
    # Apart from naming each file it loads, the generator says nothing: no warning.
    for line in result.stderr.splitlines():
        assert "Loading source unit file" in line, line
    printed = dict(re.findall(r"^---(\S+)---\n(.*?)(?=^---|\Z)", result.stdout, re.M | re.S))
    assert set(printed) == {path.name for path in generated.glob("*.service")}
    for name, text in printed.items():
        written = (generated / name).read_text()
        # The file alone starts with "# Automatically generated by ..." and an empty "# ".
        header, _, body = written.partition("\n# \n")
        assert header.startswith("# Automatically generated by"), name
        assert text.strip() == body.strip(), name


def test_quadlet_passes_each_container_command_whole(generated: Path) -> None:
    # The generator drops an empty argument ("") and every argument after it, without a word.
    # It also strips a double quote from either end of a value: HealthCmd is checked too.
    for source in quadlet_sources():
        if source.suffix != ".container":
            continue
        container = parse_unit(source.read_text())["Container"]
        service = parse_unit((generated / expected_service(source)).read_text())
        run = PodmanRun.parse(one(service, "Service", "ExecStart"))
        assert run.command == shlex.split(container.get("Exec", [""])[-1]), source.name
        if "HealthCmd" in container:  # a job (the retrain) has none: it ends by itself
            assert run.value("--health-cmd") == container["HealthCmd"][-1], source.name


# systemd-analyze verify --------------------------------------------------------------------


def test_generated_units_verify_without_a_word(
    generated: Path, podman_root: Path, tmp_path: Path
) -> None:
    services = sorted(generated.glob("*.service"))
    # Quadlets have no timers: the retrain's is installed beside the generated service.
    units = [*services, *sorted(QUADLET_DIR.glob("*.timer"))]
    root = scratch_root(tmp_path, podman_root / "usr" / "bin" / "podman", units)
    assert_quiet(verify(root, [path.name for path in units]))


def test_plain_units_verify_without_a_word(podman_root: Path, tmp_path: Path) -> None:
    services = sorted(PLAIN_DIR.glob("*.service"))
    assert {path.stem for path in services} == {
        "recsys-network",
        "recsys-internal-network",
        *CONTAINERS,
        *JOBS,
    }
    timers = sorted(PLAIN_DIR.glob("*.timer"))
    root = scratch_root(tmp_path, podman_root / "usr" / "bin" / "podman", [*services, *timers])
    assert_quiet(verify(root, [path.name for path in (*services, *timers)]))


def test_verify_does_catch_a_bad_value(podman_root: Path, tmp_path: Path) -> None:
    # The check above is worth something only if this set-up still reports mistakes.
    broken = tmp_path / "units" / "recsys-api.service"
    broken.parent.mkdir()
    text = (PLAIN_DIR / "recsys-api.service").read_text()
    broken.write_text(text.replace("RestartSec=5\n", "RestartSec=5x\n"))
    root = scratch_root(tmp_path / "root", podman_root / "usr" / "bin" / "podman", [broken])
    result = verify(root, [broken.name])
    assert "RestartSec" in result.stdout + result.stderr or "5x" in result.stdout + result.stderr


# What matters, read from the units ---------------------------------------------------------


def test_triton_serves_the_model_on_the_internal_network_only(units: dict[str, Unit]) -> None:
    run = podman_run(units, "recsys-triton")
    assert run.image == TRITON_IMAGE
    assert run.values("--network") == ["recsys-internal"]
    assert run.values("--device") == ["nvidia.com/gpu=all"]
    assert not run.has("--publish")  # gRPC and metrics reach the internal network only
    assert run.command[:2] == ["/bin/sh", "-c"]
    assert run.command[2] == (
        "exec tritonserver --model-repository=/models --model-control-mode=none "
        "--allow-http=false --exit-timeout-secs=10 "
        f"--grpc-restricted-protocol={RESTRICTED}:admin-key="
        '"$(cat /run/secrets/triton-admin-key)"'
    )
    secret = run.value("--secret").split(",")
    assert secret[0] == "recsys_triton_admin_key"
    assert {"type=mount", "target=/run/secrets/triton-admin-key", "mode=0400"} <= set(secret)
    assert volume(run, "/models") == ("/srv/recsys/models", {"ro", "z"})
    assert volume(run, "/trt-cache")[0] == "recsys-trt-cache"
    assert "ranking_model" in run.value("--health-cmd")


def test_triton_image_line_keeps_its_format() -> None:
    # recsys doctor and recsys model build-engine read the release from this line.
    lines = (QUADLET_DIR / "recsys-triton.container").read_text().splitlines()
    assert f"Image={TRITON_IMAGE}" in lines


def _host_env() -> dict[str, str]:
    values = {}
    for line in HOST_ENV.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_registry_images_are_pinned_by_the_digests_in_one_file(units: dict[str, Unit]) -> None:
    pins = _host_env()
    for name, (tag, pin) in PINNED.items():
        assert podman_run(units, name).image == f"{tag}${{{pin}}}", name
        assert pin in pins, pin
        assert pins[pin] == "" or re.fullmatch(r"@sha256:[0-9a-f]{64}", pins[pin]), pin
        # systemd reads the pins for the unit, where the image name is expanded.
        assert "/etc/recsys/host.env" in units[name]["Service"]["EnvironmentFile"], name
    assert pins["RECSYS_REDIS_PIN"]  # the one resolved here; pin-images does the others
    written = [p for p in (*QUADLET_DIR.iterdir(), *PLAIN_DIR.iterdir()) if p.is_file()]
    digests = {m for p in written for m in re.findall(r"sha256:[0-9a-f]{64}", p.read_text())}
    assert digests == set(), f"a digest outside host.env: {digests}"


def test_every_container_runs_unprivileged_on_a_read_only_root(units: dict[str, Unit]) -> None:
    users = {"recsys-triton": "1000:1000", "recsys-redis": "999:999", "recsys-api": "10001"}
    users |= {"recsys-ingest": "10001", "recsys-prometheus": "65534:65534"}
    users |= {"recsys-archive": "10001"}
    users |= {"recsys-grafana": "472:0"}
    for name in CONTAINERS:
        run = podman_run(units, name)
        assert run.value("--user") == users[name], name
        assert run.value("--cap-drop") == "all", name
        assert "no-new-privileges" in run.values("--security-opt"), name
        assert run.has("--read-only"), name


def test_redis_and_triton_reach_nothing_but_the_internal_network(units: dict[str, Unit]) -> None:
    networks = {name: podman_run(units, name).values("--network") for name in CONTAINERS}
    assert networks == {
        "recsys-triton": ["recsys-internal"],
        "recsys-redis": ["recsys-internal"],
        "recsys-api": ["recsys-internal", "recsys"],
        "recsys-ingest": ["recsys-internal"],
        "recsys-archive": ["recsys-internal"],
        "recsys-prometheus": ["recsys-internal", "recsys"],
        "recsys-grafana": ["recsys"],
    }
    quadlet = parse_unit((QUADLET_DIR / "recsys-internal.network").read_text())
    assert one(quadlet, "Network", "Internal") == "true"
    plain = parse_unit((PLAIN_DIR / "recsys-internal-network.service").read_text())
    assert "network create --internal recsys-internal" in one(plain, "Service", "ExecStart")


def test_only_the_api_and_prometheus_publish_and_where(units: dict[str, Unit]) -> None:
    published = {name: podman_run(units, name).values("--publish") for name in CONTAINERS}
    assert published == {
        "recsys-triton": [],
        "recsys-redis": [],
        "recsys-api": ["${RECSYS_API_ADDRESS}:8080:8080"],
        "recsys-ingest": [],
        "recsys-archive": [],
        "recsys-prometheus": ["127.0.0.1:9090:9090"],
        "recsys-grafana": ["127.0.0.1:3000:3000"],
    }
    # The API's address until the operator sets it: loopback, nothing beyond the host.
    assert _host_env()["RECSYS_API_ADDRESS"] == "127.0.0.1"


def test_redis_keeps_its_data_and_logs_users_in_from_secrets(units: dict[str, Unit]) -> None:
    run = podman_run(units, "recsys-redis")
    assert volume(run, "/data")[0] == "recsys-redis-data"
    assert volume(run, "/usr/local/etc/redis/redis.conf") == ("/etc/recsys/redis.conf", {"ro", "Z"})
    assert volume(run, "/run/recsys-redis") == ("/run/recsys-redis", {"z"})
    assert run.command == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    secrets = {spec.split(",")[0]: set(spec.split(",")[1:]) for spec in run.values("--secret")}
    assert secrets.keys() == {"recsys_redis_users", "recsys_redis_health"}
    assert "target=/run/secrets/redis-users.acl" in secrets["recsys_redis_users"]
    assert all("mode=0400" in options for options in secrets.values())
    assert "--user recsys-health" in run.value("--health-cmd")


def test_redis_config_is_a_feature_store() -> None:
    settings: dict[str, str] = {}
    for line in (QUADLET_DIR / "redis.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition(" ")
            settings[key] = value
    assert settings["aclfile"] == "/run/secrets/redis-users.acl"
    assert "include" not in settings
    assert "requirepass" not in settings
    assert settings["protected-mode"] == "yes"
    assert settings["unixsocket"] == "/run/recsys-redis/redis.sock"
    assert (settings["appendonly"], settings["appendfsync"]) == ("yes", "everysec")
    assert settings["save"] == '""'
    assert settings["maxmemory-policy"] == "noeviction"
    assert re.fullmatch(r"\d+[kmg]b", settings["maxmemory"])
    assert settings["dir"] == "/data"
    acl = (QUADLET_DIR / "redis-users.acl").read_text().splitlines()
    assert acl[0] == "user default off"


def test_api_is_locked_down_and_serves_the_world_read_only(units: dict[str, Unit]) -> None:
    run = podman_run(units, "recsys-api")
    assert run.value("--env-file") == "/etc/recsys/api.env"
    assert volume(run, "/var/lib/recsys/worlds") == ("/srv/recsys/worlds", {"ro", "z"})
    # Writable: a rollback rewrites the release file, /admin/worlds the worlds file.
    assert volume(run, "/var/lib/recsys/release") == ("/srv/recsys/release", {"z"})
    assert run.value("--tmpfs").startswith("/tmp:")
    # The Redis password and who may post events: files the settings read, never in the
    # environment.
    secrets = {spec.split(",")[0]: set(spec.split(",")[1:]) for spec in run.values("--secret")}
    assert secrets.keys() == {"recsys_redis_password", "recsys_event_callers"}
    for name, options in secrets.items():
        assert f"target=/run/secrets/{name}" in options
        assert "mode=0400" in options
    # Liveness only: readiness belongs to the load balancer.
    health = run.value("--health-cmd")
    assert "/healthz" in health
    assert "/readyz" not in health


def test_the_consumer_runs_the_image_as_recsys_ingest_with_its_own_login(
    units: dict[str, Unit],
) -> None:
    run = podman_run(units, "recsys-ingest")
    assert run.value("--entrypoint") == "recsys-ingest"
    assert "9108/metrics" in run.value("--health-cmd")  # the image's asks the API's port
    assert run.value("--env-file") == "/etc/recsys/ingest.env"
    assert volume(run, "/var/lib/recsys/worlds") == ("/srv/recsys/worlds", {"ro", "z"})
    # The worlds file, to apply events to each world served.
    assert volume(run, "/var/lib/recsys/release") == ("/srv/recsys/release", {"ro", "z"})
    assert (
        "RECSYS_WORLDS_FILE=/var/lib/recsys/release/worlds.toml"
        in (QUADLET_DIR / "ingest.env.example").read_text()
    )
    secret = run.value("--secret").split(",")
    assert secret[0] == "recsys_redis_ingest_password"
    assert "target=/run/secrets/recsys_redis_password" in secret
    example = (QUADLET_DIR / "ingest.env.example").read_text()
    assert "RECSYS_REDIS_USERNAME=recsys-ingest" in example
    api = (QUADLET_DIR / "api.env.example").read_text()
    partitions = re.findall(r"^RECSYS_EVENT_PARTITIONS=(\d+)", example + api, re.M)
    assert len(set(partitions)) == 1  # the API and the consumers agree


def test_the_archive_runs_the_image_as_recsys_archive_writing_its_own_folder(
    units: dict[str, Unit],
) -> None:
    run = podman_run(units, "recsys-archive")
    assert run.value("--entrypoint") == "recsys-archive"
    assert "9109/metrics" in run.value("--health-cmd")
    assert run.value("--env-file") == "/etc/recsys/archive.env"
    assert volume(run, "/var/lib/recsys/archive") == ("/srv/recsys/archive", {"z"})
    secret = run.value("--secret").split(",")
    assert secret[0] == "recsys_redis_archive_password"
    example = (QUADLET_DIR / "archive.env.example").read_text()
    assert "RECSYS_REDIS_USERNAME=recsys-archive" in example
    assert "RECSYS_ARCHIVE_URI=/var/lib/recsys/archive" in example
    api = (QUADLET_DIR / "api.env.example").read_text()
    partitions = re.findall(r"^RECSYS_EVENT_PARTITIONS=(\d+)", example + api, re.M)
    assert len(set(partitions)) == 1  # it reads every partition the API writes


def _timers(job: str) -> list[Unit]:
    """The job's timer, as the quadlet folder and the plain one ship it."""
    folders = (QUADLET_DIR, PLAIN_DIR)
    return [parse_unit((folder / f"{job}.timer").read_text()) for folder in folders]


def test_the_retrain_is_a_daily_job_its_timer_starts(units: dict[str, Unit]) -> None:
    job = units["recsys-retrain"]
    assert one(job, "Service", "Type") == "oneshot"
    assert "Install" not in job  # started by its timer, never at boot
    run = podman_run(units, "recsys-retrain")
    assert not run.has("-d")  # in the foreground: the service ends when the build does
    assert run.image == "localhost/recsys-tools:latest"
    assert run.command[0] == "retrain"
    assert run.values("--network") == ["none"]
    assert volume(run, "/var/lib/recsys/archive") == ("/srv/recsys/archive", {"ro", "z"})
    assert volume(run, "/var/lib/recsys/worlds") == ("/srv/recsys/worlds", {"z"})
    assert "--serving" in run.command
    assert run.command[run.command.index("--serving") + 1] == "/var/lib/recsys/worlds/current"
    timers = _timers("recsys-retrain")
    for timer in timers:
        assert one(timer, "Timer", "Unit") == "recsys-retrain.service"
        assert one(timer, "Timer", "Persistent") == "true"
        assert one(timer, "Install", "WantedBy") == "timers.target"
    assert timers[0]["Timer"] == timers[1]["Timer"]


def test_the_judge_acts_hourly_on_the_served_worlds_through_the_api(
    units: dict[str, Unit],
) -> None:
    job = units["recsys-judge"]
    assert one(job, "Service", "Type") == "oneshot"
    assert "Install" not in job  # started by its timer, never at boot
    run = podman_run(units, "recsys-judge")
    assert run.image == "localhost/recsys-tools:latest"
    assert run.command[:2] == ["release", "judge"]
    assert "--act" in run.command
    assert run.command[run.command.index("--url") + 1] == "http://recsys-api:8080"
    assert run.values("--network") == ["recsys-internal"]
    assert volume(run, "/var/lib/recsys/archive") == ("/srv/recsys/archive", {"ro", "z"})
    secret = run.value("--secret").split(",")
    assert secret[0] == "recsys_admin_token"
    token_file = run.command[run.command.index("--token-file") + 1]
    assert f"target={token_file}" in secret
    example = (QUADLET_DIR / "judge.env.example").read_text()
    for name in ("MIN_ANSWERS", "MAX_ANSWERS", "MARGIN"):
        assert f"RECSYS_JUDGE_{name}=" in example
    timers = _timers("recsys-judge")
    for timer in timers:
        assert one(timer, "Timer", "Unit") == "recsys-judge.service"
        assert one(timer, "Timer", "OnCalendar") == "hourly"
        assert one(timer, "Install", "WantedBy") == "timers.target"


def test_the_advance_loads_the_retrains_world_hourly_as_the_loader(
    units: dict[str, Unit],
) -> None:
    job = units["recsys-advance"]
    assert one(job, "Service", "Type") == "oneshot"
    assert "Install" not in job  # started by its timer, never at boot
    run = podman_run(units, "recsys-advance")
    assert run.image == "localhost/recsys-tools:latest"
    assert run.command[:3] == ["release", "world", "advance"]
    flags = dict(zip(run.command[3::2], run.command[4::2], strict=True))
    assert flags["--url"] == "http://recsys-api:8080"
    assert flags["--redis-username"] == "recsys-loader"
    assert flags["--triton-url"] == "recsys-triton:8001"
    assert run.values("--network") == ["recsys-internal"]
    # The worlds where the API reads them (the candidate's folder is named to it), and
    # Triton's repository, both written.
    api = podman_run(units, "recsys-api")
    assert flags["--worlds"] == "/var/lib/recsys/worlds"
    assert volume(api, "/var/lib/recsys/worlds")[0] == "/srv/recsys/worlds"
    assert volume(run, "/var/lib/recsys/worlds") == ("/srv/recsys/worlds", {"z"})
    assert volume(run, flags["--model-repository"]) == ("/srv/recsys/models", {"z"})
    secrets = [value.split(",") for value in run.values("--secret")]
    names = {secret[0]: secret for secret in secrets}
    assert f"target={flags['--token-file']}" in names["recsys_admin_token"]
    assert "target=RECSYS_REDIS_PASSWORD" in names["recsys_redis_loader_password"]
    assert f"target={flags['--admin-key-env']}" in names["recsys_triton_admin_key"]
    assert "RECSYS_ADVANCE_PERCENT=" in (QUADLET_DIR / "advance.env.example").read_text()
    timers = _timers("recsys-advance")
    for timer in timers:
        assert one(timer, "Timer", "Unit") == "recsys-advance.service"
        assert one(timer, "Install", "WantedBy") == "timers.target"
    # Half an hour off the judge's, so one does not race the other.
    assert one(timers[0], "Timer", "OnCalendar") == "*-*-* *:30:00"


def test_api_starts_after_triton_and_redis_without_depending_on_them(
    units: dict[str, Unit],
) -> None:
    api = units["recsys-api"]
    dependencies = {"recsys-triton.service", "recsys-redis.service"}
    assert dependencies <= set(words(api, "Unit", "After"))
    assert dependencies <= set(words(api, "Unit", "Wants"))
    # Requires would stop the API with Redis or Triton, when it can still answer.
    assert not dependencies & set(words(api, "Unit", "Requires"))


def test_systemctl_reload_signals_the_api_to_reload(units: dict[str, Unit]) -> None:
    reload = one(units["recsys-api"], "Service", "ExecReload").split()
    assert reload[1:] == ["kill", "--signal", RELOAD_SIGNAL.name.removeprefix("SIG"), "recsys-api"]


def test_containers_restart_always_and_stop_after_draining(units: dict[str, Unit]) -> None:
    fields = Settings.model_fields
    drain_and_grace = fields["drain_s"].default + fields["shutdown_grace_s"].default
    for name in CONTAINERS:
        unit = units[name]
        run = podman_run(units, name)
        assert one(unit, "Service", "Restart") == "always", name
        assert seconds(one(unit, "Service", "RestartSec")) == 5, name
        assert one(unit, "Service", "Type") == "notify", name
        assert one(unit, "Service", "NotifyAccess") == "all", name
        assert run.value("--sdnotify") == "conmon", name
        assert run.has("--rm"), name
        assert run.has("--replace"), name
        assert run.value("--name") == name
        # Podman sends SIGTERM, waits --stop-timeout, then kills; systemd allows more still.
        stop_timeout = float(run.value("--stop-timeout"))
        assert seconds(one(unit, "Service", "TimeoutStopSec")) > stop_timeout, name
        assert "multi-user.target" in words(unit, "Install", "WantedBy"), name
    assert float(podman_run(units, "recsys-api").value("--stop-timeout")) > drain_and_grace


def test_plain_units_stop_with_the_same_timeout() -> None:
    for name in CONTAINERS:
        unit = parse_unit((PLAIN_DIR / f"{name}.service").read_text())
        stop = shlex.split(one(unit, "Service", "ExecStop"))
        assert stop[:2] == ["/usr/bin/podman", "stop"], name
        assert stop[-1] == name
        timeout = stop[stop.index("-t") + 1]
        run = PodmanRun.parse(one(unit, "Service", "ExecStart"))
        assert timeout == run.value("--stop-timeout"), name


def test_plain_network_units_create_each_network_once() -> None:
    for network in ("recsys", "recsys-internal"):
        unit = parse_unit((PLAIN_DIR / f"{network}-network.service").read_text())
        assert one(unit, "Service", "Type") == "oneshot"
        assert one(unit, "Service", "RemainAfterExit") == "yes"
        command = shlex.split(one(unit, "Service", "ExecStart"))
        assert command[:2] == ["/bin/sh", "-c"]
        assert f"podman network exists {network} ||" in command[2]
    for name in CONTAINERS:
        container = parse_unit((PLAIN_DIR / f"{name}.service").read_text())
        run = PodmanRun.parse(one(container, "Service", "ExecStart"))
        for network in run.values("--network"):
            needed = f"{network}-network.service"
            assert needed in words(container, "Unit", "Requires"), name
            assert needed in words(container, "Unit", "After"), name


@pytest.mark.parametrize("name", CONTAINERS)
def test_quadlet_and_plain_unit_run_the_same_container(generated: Path, name: str) -> None:
    quadlet = podman_run(read_units(generated), name)
    plain = podman_run(read_units(PLAIN_DIR), name)
    assert (plain.image, plain.command) == (quadlet.image, quadlet.command)
    same = [
        "--name",
        "--network",
        "--device",
        "--publish",
        "--volume",
        "--env-file",
        "--user",
        "--cap-drop",
        "--read-only",
        "--tmpfs",
        "--secret",
        "--health-cmd",
        "--health-interval",
        "--health-timeout",
        "--health-retries",
        "--health-start-period",
        "--stop-timeout",
    ]
    for option in same:
        assert sorted(plain.values(option)) == sorted(quadlet.values(option)), option
    assert (
        {"no-new-privileges"}
        == set(plain.values("--security-opt"))
        == set(quadlet.values("--security-opt"))
    )


def test_api_env_example_holds_valid_settings() -> None:
    values: dict[str, str] = {}
    for line in (QUADLET_DIR / "api.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    fields = {f"RECSYS_{name.upper()}" for name in Settings.model_fields}
    assert set(values) <= fields, set(values) - fields
    # Validated as the service validates its environment (this process's is left out).
    settings = Settings.model_validate(
        {key.removeprefix("RECSYS_").lower(): value for key, value in values.items()}
    )
    assert settings.host == "0.0.0.0"
    assert settings.port == 8080
    assert settings.triton_url == "recsys-triton:8001"
    assert settings.redis_url == "redis://recsys-redis:6379/0"  # no password in it
    assert settings.redis_username == "recsys-api"
    assert settings.redis_password is None  # a secret file in the container
    assert settings.triton_shared_memory == "off"
    assert settings.artifacts_dir == Path("/var/lib/recsys/worlds/current")
    assert settings.release_file == Path("/var/lib/recsys/release/release.toml")
    assert settings.rules_file == Path("/var/lib/recsys/release/rules.toml")
    assert settings.admin_token is None  # /admin is off unless a token is set
    assert settings.debug_pages is False  # so is /debug/: one setting turns it on
    api = parse_unit((PLAIN_DIR / "recsys-api.service").read_text())
    stop_timeout = float(PodmanRun.parse(one(api, "Service", "ExecStart")).value("--stop-timeout"))
    assert settings.drain_s + settings.shutdown_grace_s < stop_timeout


# Triton's health check ---------------------------------------------------------------------


def run_health_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTH_CHECK), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_triton_health_check_asks_grpc_whether_the_model_is_ready() -> None:
    import grpc  # type: ignore[import-untyped]

    models = {"ranking_model": True, "warming_up": False}
    asked: list[bytes] = []

    def model_ready(request: bytes, context: Any) -> bytes:
        # ModelReadyRequest {string name = 1; string version = 2}; the answer is
        # ModelReadyResponse {bool ready = 1}, empty when false.
        asked.append(request)
        name = request[2 : 2 + request[1]].decode()
        if name not in models:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no model {name}")
        return b"\x08\x01" if models[name] else b""

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelReady": grpc.unary_unary_rpc_method_handler(model_ready)},
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{port}"
    try:
        assert run_health_check(address, "ranking_model").returncode == 0
        assert asked[-1] == b"\x0a\x0dranking_model"
        assert run_health_check(address, "ranking_model", "1").returncode == 0
        assert asked[-1] == b"\x0a\x0dranking_model\x12\x011"
        assert run_health_check(address, "warming_up").returncode == 1
        assert run_health_check(address, "missing").returncode == 1
    finally:
        server.stop(None)
    refused = run_health_check(address, "ranking_model")
    assert refused.returncode == 1
    assert "not ready" in refused.stderr
    assert run_health_check(address).returncode == 2


def test_pin_images_writes_the_digest_of_each_tag_the_units_name(tmp_path: Path) -> None:
    host_env = tmp_path / "host.env"
    host_env.write_text(HOST_ENV.read_text())
    fake = tmp_path / "bin" / "skopeo"
    fake.parent.mkdir()
    # A registry that answers every tag with the digest of its own name.
    fake.write_text(
        "#!/bin/sh\n"  # skopeo inspect --format '{{.Digest}}' docker://REF
        'printf "sha256:%s\\n" "$(printf %s "$4" | sha256sum | cut -c1-64)"\n'
    )
    fake.chmod(0o755)
    result = subprocess.run(
        [str(ROOT / "deploy" / "tools" / "pin-images"), str(host_env)],
        env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    pins = dict(
        line.split("=", 1)
        for line in host_env.read_text().splitlines()
        if line and not line.startswith("#")
    )
    for tag, pin in PINNED.values():
        expected = hashlib.sha256(f"docker://{tag}".encode()).hexdigest()
        assert pins[pin] == f"@sha256:{expected}", pin
    assert pins["RECSYS_API_ADDRESS"] == "127.0.0.1"  # the rest of the file as it was
