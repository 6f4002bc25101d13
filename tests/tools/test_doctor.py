"""`recsys doctor` against a recorded RHEL 8 GPU host: a healthy one and each known pitfall.

The host is a copy of tests/tools/doctor_fixtures/rhel8-gpu-host (the files a check reads
under /proc, /sys, /etc and /usr/lib64) and the commands' outputs as recorded from the real
tools (nvidia-smi's table, getsebool, mokutil, podman). Nothing here runs a real command
except LocalHost's own tests.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from recsys_tools.cli import main as recsys_main
from recsys_tools.doctor import (
    Check,
    CheckOutcome,
    CommandTimeoutError,
    LocalHost,
    Status,
    add_doctor_options,
    run_checks,
    run_doctor,
)
from recsys_tools.doctor.checks import (
    RELOAD_MODULES,
    check_cdi_spec,
    check_image_pins,
    check_nouveau,
    check_nvidia_driver,
    check_overcommit,
    check_podman,
    check_secure_boot,
    check_selinux,
)
from recsys_tools.doctor.cuda import (
    TRITON_CUDA,
    check_cuda_for_triton,
    driver_cuda,
    required_cuda,
)
from recsys_tools.doctor.findings import render_text
from recsys_tools.doctor.numa import check_numa, nvidia_gpus, parse_list, unit_pinning
from recsys_tools.doctor.services import on_network, redacted
from recsys_tools.doctor.units import (
    Place,
    TritonUnit,
    UnitFile,
    checkout_quadlet_dir,
    load_triton_unit,
    triton_image,
    unit_places,
)

FIXTURES = Path(__file__).parent / "doctor_fixtures"
COMMANDS = FIXTURES / "commands"
QUERY_DRIVER = ("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
GPU = "/sys/bus/pci/devices/0000:3b:00.0"
QUADLET = "/etc/containers/systemd/recsys-triton.container"
NUMA_DROPIN = "/etc/systemd/system/recsys-triton.service.d/10-numa.conf"

Result = tuple[int, str] | Exception


def recorded(name: str) -> str:
    return (COMMANDS / name).read_text()


# What the tools print on the healthy host (RHEL 8.10, a T4, driver 560.35.03).
HEALTHY_COMMANDS: dict[tuple[str, ...], Result] = {
    ("nvidia-smi",): (0, recorded("nvidia-smi-560.35.03.txt")),
    QUERY_DRIVER: (0, "560.35.03\n"),
    ("mokutil", "--sb-state"): (0, "SecureBoot enabled\n"),
    ("modinfo", "-F", "signer", "nvidia"): (0, "gpu-host-01 kernel module signing key\n"),
    ("getenforce",): (0, "Enforcing\n"),
    ("getsebool", "container_use_devices"): (0, "container_use_devices --> on\n"),
    ("nvidia-ctk", "--version"): (0, "NVIDIA Container Toolkit CLI version 1.16.2\n"),
    ("podman", "--version"): (0, "podman version 4.9.4-rhel\n"),
}


class FakeHost:
    """Files from a directory standing for /, and recorded command outputs.

    A command without a recording is missing from the host (run returns None); a recorded
    exception is raised, as LocalHost raises CommandTimeoutError.
    """

    def __init__(self, root: Path, commands: dict[tuple[str, ...], Result]) -> None:
        self.root = root
        self.files = LocalHost(root)
        self.commands = dict(commands)

    def read(self, path: str) -> str | None:
        return self.files.read(path)

    def exists(self, path: str) -> bool:
        return self.files.exists(path)

    def glob(self, pattern: str) -> list[str]:
        return self.files.glob(pattern)

    def run(self, argv: Sequence[str]) -> tuple[int, str] | None:
        result = self.commands.get(tuple(argv))
        if isinstance(result, Exception):
            raise result
        return result

    def write(self, path: str, text: str) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def remove(self, path: str) -> None:
        target = self.root / path.lstrip("/")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()

    def unit(self) -> TritonUnit | None:
        return load_triton_unit(
            self, [Place(self, "/etc/containers/systemd"), Place(self, "/etc/systemd/system")]
        )


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "rhel8-gpu-host", root)
    return FakeHost(root, HEALTHY_COMMANDS)


def doctor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_doctor_options(parser)
    return parser.parse_args(["--skip-services", *argv])


def doctor(host: FakeHost, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = run_doctor(doctor_args("--root", str(host.root), *argv), host=host, out=out)
    return status, out.getvalue()


def findings(host: FakeHost, *argv: str) -> dict[str, dict[str, str | None]]:
    _, output = doctor(host, "--json", *argv)
    return {f["check"]: f for f in json.loads(output)["findings"]}


# The healthy host, the report, the exit status.


def test_a_healthy_host_passes_every_check(host: FakeHost) -> None:
    status, output = doctor(host, "--json")
    report = json.loads(output)["findings"]
    assert [f["check"] for f in report] == [
        "nouveau",
        "nvidia-driver",
        "secure-boot",
        "selinux",
        "cdi-spec",
        "podman",
        "cuda-for-triton",
        "numa",
        "overcommit",
        "image-pins",
    ]
    assert {f["status"] for f in report} == {"ok"}, report
    assert all(f["remedy"] is None for f in report)
    assert status == 0
    by_name = {f["check"]: f["finding"] for f in report}
    assert "560.35.03" in str(by_name["nvidia-driver"])
    assert "CUDA 12.6" in str(by_name["cuda-for-triton"])
    assert "NUMA node 0" in str(by_name["numa"])


def test_the_text_report_gives_status_finding_and_remedy(host: FakeHost) -> None:
    host.commands[("getsebool", "container_use_devices")] = (0, "container_use_devices --> off\n")
    host.write("/proc/sys/vm/overcommit_memory", "0\n")
    status, output = doctor(host)
    lines = output.splitlines()
    selinux = next(i for i, line in enumerate(lines) if line.split()[1] == "selinux")
    assert lines[selinux].startswith("fail  selinux")
    assert lines[selinux + 1].split() == ["fix:", "setsebool", "-P", "container_use_devices", "on"]
    assert any(line.startswith("warn  overcommit") for line in lines)
    assert any(line.startswith("ok    nouveau") for line in lines)
    assert lines[-1] == "1 failed, 1 warned, 8 ok"
    assert "Traceback" not in output
    assert status == 1


def test_images_by_tag_alone_warn_and_a_missing_host_env_fails(host: FakeHost) -> None:
    host.write(
        "/etc/recsys/host.env", "RECSYS_REDIS_PIN=@sha256:" + "1" * 64 + "\nRECSYS_TRITON_PIN=\n"
    )
    outcome = check_image_pins(host)
    assert outcome.status is Status.WARN
    assert "RECSYS_TRITON_PIN" in outcome.finding
    assert "RECSYS_REDIS_PIN" not in outcome.finding
    assert "deploy/tools/pin-images" in (outcome.remedy or "")
    host.remove("/etc/recsys/host.env")
    assert check_image_pins(host).status is Status.FAIL


def test_warnings_alone_exit_zero(host: FakeHost) -> None:
    host.write("/proc/sys/vm/overcommit_memory", "0\n")
    host.commands[("podman", "--version")] = (0, "podman version 4.2.0\n")
    status, output = doctor(host, "--json")
    report = json.loads(output)
    assert {f["check"]: f["status"] for f in report["findings"] if f["status"] != "ok"} == {
        "overcommit": "warn",
        "podman": "warn",
    }
    assert status == 0
    checks = len(report["findings"])
    assert report["summary"] == {
        "status": "warn",
        "exit_status": 0,
        "checks": checks,
        "ok": checks - 2,
        "warn": 2,
        "fail": 0,
        "failed": [],
        "warned": ["podman", "overcommit"],
    }


def test_a_host_without_any_tool_is_reported_not_crashed(host: FakeHost) -> None:
    host.commands.clear()
    status, output = doctor(host, "--json")
    whole = json.loads(output)
    report = {f["check"]: f for f in whole["findings"]}
    assert whole["summary"]["status"] == "fail"
    assert whole["summary"]["exit_status"] == status == 1
    assert "nvidia-driver" in whole["summary"]["failed"]
    assert report["nvidia-driver"]["status"] == "fail"
    assert "nvidia-smi not found" in str(report["nvidia-driver"]["finding"])
    assert report["podman"]["status"] == "fail"
    assert report["secure-boot"]["status"] == "warn"
    assert "mokutil not found" in str(report["secure-boot"]["finding"])
    assert report["selinux"]["status"] == "warn"
    assert status == 1


def test_a_check_that_raises_fails_alone_with_the_reason(host: FakeHost) -> None:
    host.commands[("nvidia-smi",)] = CommandTimeoutError("nvidia-smi did not finish within 15 s")
    report = findings(host)
    assert report["nvidia-driver"]["status"] == "fail"
    assert report["nvidia-driver"]["finding"] == "nvidia-smi did not finish within 15 s"
    assert "journalctl -k" in str(report["nvidia-driver"]["remedy"])
    assert report["nouveau"]["status"] == "ok"  # the others still ran

    def broken() -> CheckOutcome:
        raise KeyError("boom")

    [finding] = run_checks([Check("broken", broken)])
    assert finding.status is Status.FAIL
    assert finding.finding == "the check could not run: KeyError: 'boom'"
    assert finding.remedy


def test_findings_and_remedies_print_on_one_line() -> None:
    [finding] = run_checks([Check("x", lambda: CheckOutcome(Status.FAIL, "a\nb", "c\n  d"))])
    assert (finding.finding, finding.remedy) == ("a b", "c d")
    assert render_text([finding]).splitlines() == [
        "fail  x  a b",
        "         fix: c d",
        "1 failed, 0 warned, 0 ok",
    ]


def test_recsys_doctor_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty_root = tmp_path / "empty"
    empty_root.mkdir()
    argv = ["doctor", "--root", str(empty_root), "--units", str(tmp_path), "--skip-services"]
    with pytest.raises(SystemExit) as exited:
        recsys_main([*argv, "--json"])
    assert exited.value.code == 1  # no driver under an empty root, whatever this machine has
    report = json.loads(capsys.readouterr().out)["findings"]
    assert {f["check"]: f["status"] for f in report}["nvidia-driver"] == "fail"


# 1. nouveau


def test_nouveau_loaded_fails_with_the_blacklist(host: FakeHost) -> None:
    modules = host.read("/proc/modules") or ""
    host.write("/proc/modules", modules + "nouveau 2424832 0 - Live 0xffffffffc1a00000\n")
    host.remove("/etc/modprobe.d/blacklist-nouveau.conf")
    outcome = check_nouveau(host)
    assert outcome.status is Status.FAIL
    assert outcome.remedy is not None
    assert "blacklist nouveau" in outcome.remedy
    assert "options nouveau modeset=0" in outcome.remedy
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in outcome.remedy
    assert "dracut --force && reboot" in outcome.remedy


def test_nouveau_loaded_despite_the_blacklist_needs_the_initramfs(host: FakeHost) -> None:
    modules = host.read("/proc/modules") or ""
    host.write("/proc/modules", "nouveau 2424832 0 - Live 0xffffffffc1a00000\n" + modules)
    outcome = check_nouveau(host)
    assert outcome.status is Status.FAIL
    assert "initramfs" in outcome.finding
    assert outcome.remedy == "dracut --force && reboot"


def test_a_module_named_like_nouveau_is_not_nouveau(host: FakeHost) -> None:
    host.write("/proc/modules", "nouveau_helper 1 0 - Live 0x0\nnvidia 1 0 - Live 0x0\n")
    assert check_nouveau(host).status is Status.OK


# 2. the driver


def test_nvml_mismatch_after_an_update_fails_with_the_module_reload(host: FakeHost) -> None:
    # The driver went from 550.54.15 to 560.35.03 without a reboot.
    host.write("/proc/driver/nvidia/version", recorded("proc-driver-nvidia-version-550.54.15.txt"))
    host.commands[("nvidia-smi",)] = (18, recorded("nvidia-smi-nvml-mismatch.txt"))
    host.commands[QUERY_DRIVER] = (18, recorded("nvidia-smi-nvml-mismatch.txt"))
    outcome = check_nvidia_driver(host)
    assert outcome.status is Status.FAIL
    assert "Failed to initialize NVML: Driver/library version mismatch" in outcome.finding
    assert "kernel module 550.54.15, library 560.35" in outcome.finding
    assert outcome.remedy is not None
    assert "reboot" in outcome.remedy
    assert RELOAD_MODULES in outcome.remedy
    assert RELOAD_MODULES == (
        "modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia && modprobe nvidia"
    )


def test_kernel_module_and_library_versions_differing_fails(host: FakeHost) -> None:
    host.write("/proc/driver/nvidia/version", recorded("proc-driver-nvidia-version-550.54.15.txt"))
    outcome = check_nvidia_driver(host)  # nvidia-smi --query-gpu still says 560.35.03
    assert outcome.status is Status.FAIL
    assert "kernel module 550.54.15" in outcome.finding
    assert "560.35.03" in outcome.finding
    assert RELOAD_MODULES in (outcome.remedy or "")


def test_installed_libraries_show_the_mismatch_without_nvidia_smi(host: FakeHost) -> None:
    host.write("/proc/driver/nvidia/version", recorded("proc-driver-nvidia-version-550.54.15.txt"))
    del host.commands[("nvidia-smi",)]
    outcome = check_nvidia_driver(host)
    assert outcome.status is Status.FAIL
    assert "installed library is 560.35.03" in outcome.finding


def test_driver_not_loaded_fails_with_the_install(host: FakeHost) -> None:
    host.remove("/proc/driver/nvidia/version")
    outcome = check_nvidia_driver(host)
    assert outcome.status is Status.FAIL
    assert "not loaded" in outcome.finding
    assert "dnf install" in (outcome.remedy or "")
    assert "cuda-drivers" in (outcome.remedy or "")


def test_the_open_kernel_module_version_is_read_too(host: FakeHost) -> None:
    host.write(
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:42:42 UTC 2024\n",
    )
    assert check_nvidia_driver(host).status is Status.OK


def test_nvidia_smi_failing_otherwise_is_reported(host: FakeHost) -> None:
    host.commands[("nvidia-smi",)] = (
        9,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.\n\n",
    )
    outcome = check_nvidia_driver(host)
    assert outcome.status is Status.FAIL
    assert outcome.finding.startswith("nvidia-smi failed (exit 9): NVIDIA-SMI has failed")


# 3. Secure Boot


def test_secure_boot_with_an_unsigned_module_fails(host: FakeHost) -> None:
    host.commands[("modinfo", "-F", "signer", "nvidia")] = (0, "\n")
    outcome = check_secure_boot(host)
    assert outcome.status is Status.FAIL
    assert "unsigned" in outcome.finding
    assert outcome.remedy is not None
    assert "mokutil --import" in outcome.remedy
    assert "scripts/sign-file sha256" in outcome.remedy


def test_secure_boot_off_needs_no_signature(host: FakeHost) -> None:
    host.commands[("mokutil", "--sb-state")] = (0, "SecureBoot disabled\n")
    host.commands[("modinfo", "-F", "signer", "nvidia")] = (0, "\n")
    assert check_secure_boot(host) == CheckOutcome(Status.OK, "Secure Boot is off")


def test_legacy_boot_has_no_secure_boot(host: FakeHost) -> None:
    host.commands[("mokutil", "--sb-state")] = (255, "This system doesn't support Secure Boot\n")
    assert check_secure_boot(host).status is Status.OK


def test_a_signed_module_that_did_not_load_points_at_the_key(host: FakeHost) -> None:
    host.remove("/proc/driver/nvidia/version")
    outcome = check_secure_boot(host)
    assert outcome.status is Status.FAIL
    assert "not loaded" in outcome.finding
    assert "mokutil --import" in (outcome.remedy or "")


# 4. SELinux


def test_selinux_enforcing_with_the_boolean_off_fails(host: FakeHost) -> None:
    host.commands[("getsebool", "container_use_devices")] = (0, "container_use_devices --> off\n")
    outcome = check_selinux(host)
    assert outcome.status is Status.FAIL
    assert outcome.remedy == "setsebool -P container_use_devices on"


def test_selinux_permissive_does_not_need_the_boolean(host: FakeHost) -> None:
    host.commands[("getenforce",)] = (0, "Permissive\n")
    host.commands[("getsebool", "container_use_devices")] = (0, "container_use_devices --> off\n")
    assert check_selinux(host).status is Status.OK


def test_a_policy_without_the_boolean_fails(host: FakeHost) -> None:
    host.commands[("getsebool", "container_use_devices")] = (
        1,
        "getsebool:  Error getting active value for container_use_devices\n",
    )
    outcome = check_selinux(host)
    assert outcome.status is Status.FAIL
    assert "Error getting active value" in outcome.finding
    assert "container-selinux" in (outcome.remedy or "")


# 5. the CDI spec


def test_no_cdi_spec_fails_with_nvidia_ctk(host: FakeHost) -> None:
    host.remove("/etc/cdi")
    outcome = check_cdi_spec(host)
    assert outcome.status is Status.FAIL
    assert outcome.remedy == "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    del host.commands[("nvidia-ctk", "--version")]
    assert check_cdi_spec(host).remedy == (
        "dnf install nvidia-container-toolkit && "
        "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    )


def test_the_runtime_cdi_directory_counts(host: FakeHost) -> None:
    spec = host.read("/etc/cdi/nvidia.yaml") or ""
    host.remove("/etc/cdi")
    host.write("/var/run/cdi/nvidia.yaml", spec)
    assert check_cdi_spec(host).status is Status.OK


def test_a_cdi_spec_from_the_previous_driver_fails(host: FakeHost) -> None:
    spec = (host.read("/etc/cdi/nvidia.yaml") or "").replace("560.35.03", "550.54.15")
    host.write("/etc/cdi/nvidia.yaml", spec)
    outcome = check_cdi_spec(host)
    assert outcome.status is Status.FAIL
    assert "generated for driver 550.54.15 but driver 560.35.03 is loaded" in outcome.finding
    assert outcome.remedy == "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


# 6. Podman


def test_podman_4_2_warns_to_use_the_plain_units(host: FakeHost) -> None:
    host.commands[("podman", "--version")] = (0, "podman version 4.2.0\n")
    outcome = check_podman(host)
    assert outcome.status is Status.WARN
    assert "4.2.0" in outcome.finding
    assert "deploy/systemd" in (outcome.remedy or "")


def test_podman_before_4_1_cannot_pass_the_gpu(host: FakeHost) -> None:
    host.commands[("podman", "--version")] = (0, "podman version 4.0.2\n")
    outcome = check_podman(host)
    assert outcome.status is Status.FAIL
    assert "CDI" in outcome.finding


def test_podman_4_9_runs_quadlets_and_4_4_is_sent_to_the_plain_units(host: FakeHost) -> None:
    host.commands[("podman", "--version")] = (0, "podman version 4.9.4-rhel\n")
    assert check_podman(host).status is Status.OK
    host.commands[("podman", "--version")] = (0, "podman version 4.4.1\n")
    outcome = check_podman(host)
    assert outcome.status is Status.WARN
    assert "4.9" in outcome.finding


# 7. the driver's CUDA against the Triton release


def test_a_cuda_12_2_driver_cannot_run_triton_24_10(host: FakeHost) -> None:
    host.write(
        "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  "
        "Sat Aug 19 01:15:15 UTC 2023\n",
    )
    host.commands[("nvidia-smi",)] = (0, recorded("nvidia-smi-535.104.05.txt"))
    outcome = check_cuda_for_triton(host, host.unit())
    assert outcome.status is Status.FAIL
    assert "the driver supports CUDA 12.2 (nvidia-smi)" in outcome.finding
    assert "tritonserver:24.10-py3" in outcome.finding
    assert "needs CUDA 12.6" in outcome.finding
    assert outcome.remedy is not None
    assert "driver R560 or later" in outcome.remedy
    assert f"tritonserver:23.10-py3 in {QUADLET}" in outcome.remedy
    assert "forward-compatibility" in outcome.remedy


def test_driver_550_reads_cuda_12_4_from_the_header(host: FakeHost) -> None:
    host.commands[("nvidia-smi",)] = (0, recorded("nvidia-smi-550.54.15.txt"))
    assert driver_cuda(host) == ((12, 4), "nvidia-smi")
    assert check_cuda_for_triton(host, host.unit()).status is Status.FAIL  # 24.10 needs 12.6
    unit = (host.read(QUADLET) or "").replace("tritonserver:24.10-py3", "tritonserver:24.05-py3")
    host.write(QUADLET, unit)
    outcome = check_cuda_for_triton(host, host.unit())
    assert outcome.status is Status.OK
    assert outcome.finding == (
        "the driver supports CUDA 12.4; nvcr.io/nvidia/tritonserver:24.05-py3 needs 12.4"
    )


def test_without_nvidia_smi_the_driver_branch_gives_the_cuda_version(host: FakeHost) -> None:
    host.commands[("nvidia-smi",)] = (18, recorded("nvidia-smi-nvml-mismatch.txt"))
    host.write("/proc/driver/nvidia/version", recorded("proc-driver-nvidia-version-550.54.15.txt"))
    assert driver_cuda(host) == ((12, 4), "driver 550.54.15")


def test_the_triton_table() -> None:
    assert TRITON_CUDA[(24, 10)] == (12, 6)
    assert TRITON_CUDA[(24, 5)] == (12, 4)
    assert TRITON_CUDA[(24, 1)] == (12, 3)
    assert TRITON_CUDA[(23, 10)] == (12, 2)
    required = required_cuda((24, 9))  # between two 12.6 releases
    assert required is not None
    assert (required.cuda, required.exact) == ((12, 6), True)
    required = required_cuda((24, 2))  # between 12.3 and 12.4: only a lower bound
    assert required is not None
    assert (required.cuda, required.exact) == ((12, 3), False)
    assert required_cuda((21, 1)) is None


def test_a_release_missing_from_the_table_warns(host: FakeHost) -> None:
    unit = (host.read(QUADLET) or "").replace("tritonserver:24.10-py3", "tritonserver:24.02-py3")
    host.write(QUADLET, unit)
    outcome = check_cuda_for_triton(host, host.unit())
    assert outcome.status is Status.WARN
    assert "24.02" in outcome.finding


def test_no_triton_unit_warns(host: FakeHost) -> None:
    host.remove(QUADLET)
    assert host.unit() is None
    outcome = check_cuda_for_triton(host, None, "/etc/containers/systemd")
    assert outcome.status is Status.WARN
    assert "no Triton unit found in /etc/containers/systemd" in outcome.finding


# 8. NUMA


def test_gpu_on_node_1_with_triton_pinned_to_node_0_fails(host: FakeHost) -> None:
    host.write(f"{GPU}/numa_node", "1\n")
    outcome = check_numa(host, host.unit())
    assert outcome.status is Status.FAIL
    assert "GPU 0 (0000:3b:00.0) is on NUMA node 1 of 2" in outcome.finding
    assert "pinned to node 0" in outcome.finding
    assert NUMA_DROPIN in outcome.finding
    assert outcome.remedy is not None
    assert f"node 1 instead in {NUMA_DROPIN}: CPUAffinity=16-31,48-63 and NUMAMask=1" in (
        outcome.remedy
    )


def test_no_pinning_on_a_two_node_host_warns_with_a_drop_in(host: FakeHost) -> None:
    host.remove(NUMA_DROPIN)
    outcome = check_numa(host, host.unit())
    assert outcome.status is Status.WARN
    assert "does not pin Triton" in outcome.finding
    assert outcome.remedy == (
        "mkdir -p /etc/systemd/system/recsys-triton.service.d && printf '[Service]\\n"
        "CPUAffinity=0-15,32-47\\nNUMAPolicy=bind\\nNUMAMask=0\\n' > "
        "/etc/systemd/system/recsys-triton.service.d/10-numa.conf && "
        "systemctl daemon-reload && systemctl restart recsys-triton"
    )


def test_a_host_without_numa_information_warns(host: FakeHost) -> None:
    host.remove("/sys/devices/system/node")
    assert check_numa(host, host.unit()).status is Status.WARN


def test_a_single_node_host_needs_no_pinning(host: FakeHost) -> None:
    host.remove("/sys/devices/system/node/node1")
    host.remove(NUMA_DROPIN)
    assert check_numa(host, host.unit()).status is Status.OK


def test_pinning_to_both_nodes_warns(host: FakeHost) -> None:
    host.write(NUMA_DROPIN, "[Service]\nCPUAffinity=0-63\n")
    outcome = check_numa(host, host.unit())
    assert outcome.status is Status.WARN
    assert "pinned to nodes 0,1" in outcome.finding


def test_numactl_and_podman_cpusets_count_as_pinning(host: FakeHost) -> None:
    host.remove(NUMA_DROPIN)
    host.write(f"{GPU}/numa_node", "1\n")
    unit = host.read(QUADLET) or ""
    host.write(QUADLET, unit.replace("PodmanArgs=", "PodmanArgs=--cpuset-cpus=16-31 "))
    assert check_numa(host, host.unit()).status is Status.OK
    host.remove(QUADLET)
    host.write(
        "/etc/systemd/system/recsys-triton.service",
        "[Service]\nExecStart=/usr/bin/numactl --cpunodebind=0 -m 0 \\\n"
        "    /usr/bin/podman run --rm --device nvidia.com/gpu=all -m 4g \\\n"
        "    nvcr.io/nvidia/tritonserver:24.10-py3 tritonserver --model-repository=/models\n",
    )
    unit_found = host.unit()
    assert unit_found is not None
    assert unit_found.path == "/etc/systemd/system/recsys-triton.service"
    outcome = check_numa(host, unit_found)
    assert outcome.status is Status.FAIL
    assert "pinned to node 0" in outcome.finding
    assert check_cuda_for_triton(host, unit_found).status is Status.OK


def test_the_gpu_named_in_the_unit_is_the_one_checked(host: FakeHost) -> None:
    second = "/sys/bus/pci/devices/0000:af:00.0"
    host.write(f"{second}/vendor", "0x10de\n")
    host.write(f"{second}/class", "0x030200\n")
    host.write(f"{second}/numa_node", "1\n")
    host.write(f"{GPU}/../0000:3b:00.1/vendor", "0x10de\n")  # the GPU's audio function
    host.write(f"{GPU}/../0000:3b:00.1/class", "0x040300\n")
    assert [gpu.bus_id for gpu in nvidia_gpus(host)] == ["0000:3b:00.0", "0000:af:00.0"]
    assert check_numa(host, host.unit()).status is Status.OK  # gpu=all: GPU 0, node 0
    unit = host.read(QUADLET) or ""
    host.write(QUADLET, unit.replace("nvidia.com/gpu=all", "nvidia.com/gpu=1"))
    outcome = check_numa(host, host.unit())
    assert outcome.status is Status.FAIL
    assert "GPU 1 (0000:af:00.0) is on NUMA node 1" in outcome.finding
    assert "the GPUs span nodes 0,1" in outcome.finding


def test_pinning_that_is_not_a_list_of_numbers_warns(host: FakeHost) -> None:
    host.write(NUMA_DROPIN, "[Service]\nCPUAffinity=%i\n")
    outcome = check_numa(host, host.unit())
    assert outcome.status is Status.WARN
    assert f"{NUMA_DROPIN}: 'CPUAffinity=%i' is not a list of numbers" in outcome.finding


def test_a_gpu_without_a_numa_node_warns(host: FakeHost) -> None:
    host.write(f"{GPU}/numa_node", "-1\n")
    assert check_numa(host, host.unit()).status is Status.WARN


def test_commented_out_settings_are_not_pinning() -> None:
    unit = TritonUnit(
        UnitFile(
            "/x.container",
            "[Service]\n# CPUAffinity=16-31\n;NUMAMask=1\nCPUAffinity=\nNUMAMask=numa\n",
        )
    )
    nodes = {0: ("0-3", frozenset(range(4))), 1: ("4-7", frozenset(range(4, 8)))}
    assert unit_pinning(unit, nodes).nodes == frozenset()
    assert parse_list("0-2, 5 7") == {0, 1, 2, 5, 7}
    assert parse_list("all", frozenset({0, 1})) == {0, 1}


# 9. overcommit


def test_overcommit_0_warns_with_the_sysctl_line(host: FakeHost) -> None:
    host.write("/proc/sys/vm/overcommit_memory", "0\n")
    outcome = check_overcommit(host)
    assert outcome.status is Status.WARN
    assert "vm.overcommit_memory = 0" in outcome.finding
    assert outcome.remedy == (
        "echo 'vm.overcommit_memory = 1' >> /etc/sysctl.d/90-recsys.conf && "
        "sysctl -p /etc/sysctl.d/90-recsys.conf"
    )


# Where the unit is found.


def test_drop_ins_next_to_the_quadlet_and_in_systemd_both_apply(host: FakeHost) -> None:
    host.write(
        "/etc/containers/systemd/recsys-triton.container.d/20-extra.conf", "[Service]\nNice=-5\n"
    )
    unit = host.unit()
    assert unit is not None
    assert [f.path for f in unit.files] == [
        QUADLET,
        "/etc/containers/systemd/recsys-triton.container.d/20-extra.conf",
        NUMA_DROPIN,
    ]


def test_units_given_on_the_command_line_are_read_as_given(host: FakeHost, tmp_path: Path) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "recsys-triton.container").write_text(
        "[Container]\nImage=nvcr.io/nvidia/tritonserver:23.10-py3\n"
    )
    places = unit_places(host, units)
    assert len(places) == 1
    unit = load_triton_unit(host, places)
    assert unit is not None
    assert unit.path == f"{units}/recsys-triton.container"
    assert triton_image(unit) == ("nvcr.io/nvidia/tritonserver:23.10-py3", (23, 10))
    assert [d.path for d in unit.dropins] == [NUMA_DROPIN]  # the host's drop-in still applies
    report = findings(host, "--units", str(units))
    assert report["cuda-for-triton"]["status"] == "ok"


def test_the_checkouts_quadlet_parses() -> None:
    directory = checkout_quadlet_dir()
    if directory is None or not (directory / "recsys-triton.container").exists():
        pytest.skip("no deploy/quadlet/recsys-triton.container in this checkout")
    unit = load_triton_unit(LocalHost(Path("/")), [Place(LocalHost(), str(directory))])
    assert unit is not None
    image = triton_image(unit)
    assert image is not None
    assert required_cuda(image[1]) is not None, f"{image[0]} is not in the CUDA table"


# The services' helpers (the checks themselves run against real servers in
# tests/integration/test_doctor_live.py).


def test_the_remedies_name_the_containers_addresses() -> None:
    assert on_network("recsys-redis") == (
        "$(podman inspect --format '{{.NetworkSettings.Networks.recsys.IPAddress}}' recsys-redis)"
    )


def test_redis_passwords_are_not_printed() -> None:
    assert redacted("redis://:s3cret@recsys-redis:6379/0") == "redis://:***@recsys-redis:6379/0"
    assert redacted("redis://app:s3cret@10.0.0.5:6379/0") == "redis://app:***@10.0.0.5:6379/0"
    assert redacted("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_bad_service_settings_fail_both_service_checks(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECSYS_REQUEST_BUDGET_MS", "1")
    out = io.StringIO()
    args = doctor_args("--json")
    args.skip_services = False
    assert run_doctor(args, host=host, out=out) == 1
    report = {f["check"]: f for f in json.loads(out.getvalue())["findings"]}
    for name in ("triton", "redis"):
        assert report[name]["status"] == "fail"
        assert "cannot configure the service checks" in str(report[name]["finding"])


# LocalHost, the real one.


def test_local_host_reads_files_under_its_root(tmp_path: Path) -> None:
    (tmp_path / "proc" / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "vm" / "overcommit_memory").write_text("1\n")
    local = LocalHost(tmp_path)
    assert local.read("/proc/sys/vm/overcommit_memory") == "1\n"
    assert local.read("/proc/nothing") is None
    assert local.read("/proc") is None  # a directory
    assert local.exists("/proc/sys")
    assert local.glob("/proc/sys/vm/*") == ["/proc/sys/vm/overcommit_memory"]


def test_local_host_runs_commands_and_reports_missing_ones(tmp_path: Path) -> None:
    local = LocalHost(tmp_path, timeout_s=5)
    assert local.run(["recsys-doctor-no-such-command"]) is None
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    assert local.run([sys.executable, "-c", code]) == (3, "out\nerr\n")


def test_local_host_times_out_a_hung_command(tmp_path: Path) -> None:
    local = LocalHost(tmp_path, timeout_s=0.2)
    with pytest.raises(CommandTimeoutError, match="did not finish within"):
        local.run([sys.executable, "-c", "import time; time.sleep(5)"])
