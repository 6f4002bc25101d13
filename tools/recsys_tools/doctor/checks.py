"""Host checks: kernel modules, the driver, Secure Boot, SELinux, CDI, Podman, sysctls.

Each takes a Host and returns a CheckOutcome; the remedy is the command to run or the file to
change. The pitfalls are the ones deploy/triton/README.md's host set-up guards against.
"""

from __future__ import annotations

import re

from recsys_tools.doctor.findings import CheckOutcome, fail, ok, warn
from recsys_tools.doctor.host import Host

PROC_NVIDIA_VERSION = "/proc/driver/nvidia/version"
NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")
OVERCOMMIT = "/proc/sys/vm/overcommit_memory"

NVML_MISMATCH = "Driver/library version mismatch"
RELOAD_MODULES = "modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia && modprobe nvidia"
MISMATCH_REMEDY = (
    "reboot; or stop what uses the GPU (systemctl stop recsys-triton) and reload the modules "
    f"in dependency order: {RELOAD_MODULES}"
)
INSTALL_DRIVER = (
    "dnf install kernel-devel-$(uname -r) kernel-headers-$(uname -r) cuda-drivers, then reboot "
    "(or modprobe nvidia); if it is installed, see dkms status and journalctl -k | grep -i nvidia"
)
CDI_GENERATE = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"

_VERSION = r"(\d+(?:\.\d+)+)"
_KERNEL_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+" + _VERSION)
_NVML_LIBRARY = re.compile(r"NVML library version:\s*" + _VERSION)
_SMI_DRIVER = re.compile(r"Driver Version:\s*" + _VERSION)
_LIBRARY_FILE = re.compile(r"libnvidia-ml\.so\." + _VERSION + "$")
_CDI_LIBRARY = re.compile(r"lib(?:cuda|nvidia-ml)\.so\." + _VERSION)
_PODMAN = re.compile(r"podman version (\d+)\.(\d+)(?:\.(\d+))?\S*")
_SEBOOL = re.compile(r"container_use_devices\s+-->\s+(on|off)")

# Quadlets (.container files turned into services by a systemd generator) came in Podman 4.4,
# but deploy/quadlet is written for (and checked against) the generator of 4.9 and later: an
# older one refuses keys it does not know. The docs name this one threshold (a test checks).
# CDI devices (--device nvidia.com/gpu=all) came in 4.1.
QUADLET_PODMAN = (4, 9)
CDI_PODMAN = (4, 1)


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(str(part) for part in version)


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return "(no output)"


def kernel_module_version(host: Host) -> str | None:
    """The loaded nvidia.ko's version, from /proc/driver/nvidia/version."""
    text = host.read(PROC_NVIDIA_VERSION)
    match = _KERNEL_MODULE.search(text or "")
    return match.group(1) if match else None


def installed_library_versions(host: Host) -> set[str]:
    """Versions of the user-space NVML library installed (libnvidia-ml.so.X.Y.Z files)."""
    versions: set[str] = set()
    for path in host.glob("/usr/lib64/libnvidia-ml.so.*"):
        match = _LIBRARY_FILE.search(path)
        if match:
            versions.add(match.group(1))
    return versions


def check_nouveau(host: Host) -> CheckOutcome:
    modules = host.read("/proc/modules")
    if modules is None:
        return warn(
            "cannot read /proc/modules",
            "run on the host itself, not in a container, or pass --root",
        )
    if not any(line.split(" ", 1)[0] == "nouveau" for line in modules.splitlines()):
        return ok("nouveau is not loaded")
    blacklist = (
        f"printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > {NOUVEAU_BLACKLIST} && "
    )
    if host.read(NOUVEAU_BLACKLIST) is not None:
        return fail(
            f"nouveau is loaded although {NOUVEAU_BLACKLIST} exists: the initramfs still loads it",
            "dracut --force && reboot",
        )
    return fail(
        "nouveau is loaded: it holds the GPU, so the NVIDIA driver cannot",
        f"{blacklist}dracut --force && reboot (then lsmod | grep nouveau prints nothing)",
    )


def check_nvidia_driver(host: Host) -> CheckOutcome:
    if host.read(PROC_NVIDIA_VERSION) is None:
        return fail(
            f"the NVIDIA kernel module is not loaded (no {PROC_NVIDIA_VERSION})", INSTALL_DRIVER
        )
    kernel = kernel_module_version(host)
    if kernel is None:
        return warn(
            f"cannot read the kernel module's version from {PROC_NVIDIA_VERSION}",
            f"cat {PROC_NVIDIA_VERSION}",
        )
    libraries = installed_library_versions(host)
    smi = host.run(["nvidia-smi"])
    if smi is None:
        stale = sorted(libraries - {kernel})
        if stale:
            return fail(
                f"kernel module {kernel} is loaded but the installed library is "
                f"{', '.join(stale)} (and nvidia-smi is missing)",
                MISMATCH_REMEDY,
            )
        return fail(
            f"nvidia-smi not found (kernel module {kernel} is loaded)",
            "dnf install cuda-drivers (it brings nvidia-smi and the user-space libraries)",
        )
    status, output = smi
    if NVML_MISMATCH in output:
        library = _NVML_LIBRARY.search(output)
        other = library.group(1) if library else ", ".join(sorted(libraries - {kernel}))
        return fail(
            f"nvidia-smi: Failed to initialize NVML: {NVML_MISMATCH} "
            f"(kernel module {kernel}, library {other or 'of another version'}): "
            "the driver was updated without a reboot",
            MISMATCH_REMEDY,
        )
    if status != 0:
        return fail(
            f"nvidia-smi failed (exit {status}): {first_line(output)}",
            "journalctl -k | grep -iE 'nvrm|xid' for the driver's error; then reboot",
        )
    query = host.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    reported: list[str] = []
    if query is not None and query[0] == 0:
        reported = [line.strip() for line in query[1].splitlines() if line.strip()]
    elif header := _SMI_DRIVER.search(output):
        reported = [header.group(1)]
    stale = sorted((set(reported) | libraries) - {kernel})
    if stale:
        return fail(
            f"kernel module {kernel} is loaded but the user-space library is {', '.join(stale)}",
            MISMATCH_REMEDY,
        )
    counted = query is not None and query[0] == 0
    gpus = f"; nvidia-smi sees {len(reported)} GPU(s)" if counted else ""
    return ok(f"driver {kernel}: kernel module and user-space library agree{gpus}")


SIGN_MODULE = (
    "sign the modules with a key enrolled as a MOK: mokutil --import signing_key.der "
    "(reboot, enroll it in MokManager), then for each of nvidia nvidia_uvm nvidia_modeset "
    "nvidia_drm: /usr/src/kernels/$(uname -r)/scripts/sign-file sha256 signing_key.priv "
    "signing_key.der $(modinfo -n MODULE); or turn Secure Boot off in the firmware"
)


def check_secure_boot(host: Host) -> CheckOutcome:
    state = host.run(["mokutil", "--sb-state"])
    if state is None:
        return warn(
            "mokutil not found: cannot tell whether Secure Boot is on", "dnf install mokutil"
        )
    if "SecureBoot enabled" not in state[1]:
        if "SecureBoot disabled" in state[1]:
            return ok("Secure Boot is off")
        return ok(f"no Secure Boot: {first_line(state[1])}")
    signer = host.run(["modinfo", "-F", "signer", "nvidia"])
    if signer is None:
        return warn(
            "Secure Boot is on and modinfo is missing: cannot tell whether nvidia.ko is signed",
            "dnf install kmod, then modinfo -F signer nvidia",
        )
    status, output = signer
    if status != 0:
        return warn(
            f"Secure Boot is on and the nvidia module cannot be read: {first_line(output)}",
            INSTALL_DRIVER,
        )
    name = output.strip()
    if not name:
        return fail(
            "Secure Boot is on and the nvidia module is unsigned: the kernel refuses to load it "
            "(modprobe: Operation not permitted / Key was rejected by service)",
            SIGN_MODULE,
        )
    if host.read(PROC_NVIDIA_VERSION) is None:
        return fail(
            f"Secure Boot is on; the nvidia module is signed by {name!r} but not loaded: "
            "its key is probably not enrolled",
            "mokutil --import with that key's DER certificate, reboot, enroll it in MokManager; "
            "mokutil --list-enrolled shows the enrolled keys",
        )
    return ok(f"Secure Boot is on and the nvidia module is signed by {name!r}")


def check_selinux(host: Host) -> CheckOutcome:
    mode = host.run(["getenforce"])
    if mode is None:
        return warn(
            "getenforce not found: cannot tell the SELinux mode", "dnf install libselinux-utils"
        )
    current = mode[1].strip() or "unknown"
    if current != "Enforcing":
        return ok(f"SELinux is {current}: container_use_devices does not matter")
    boolean = host.run(["getsebool", "container_use_devices"])
    if boolean is None:
        return warn(
            "SELinux is enforcing and getsebool is missing: cannot read container_use_devices",
            "setsebool -P container_use_devices on",
        )
    match = _SEBOOL.search(boolean[1])
    if match is None:
        return fail(
            f"SELinux is enforcing and container_use_devices cannot be read: "
            f"{first_line(boolean[1])}",
            "dnf install container-selinux && setsebool -P container_use_devices on",
        )
    if match.group(1) == "off":
        return fail(
            "container_use_devices is off while SELinux is enforcing: containers cannot open "
            "/dev/nvidia* (nvidia-smi works on the host and fails in the container)",
            "setsebool -P container_use_devices on",
        )
    return ok("SELinux is enforcing and container_use_devices is on")


def check_cdi_spec(host: Host) -> CheckOutcome:
    remedy = CDI_GENERATE
    if host.run(["nvidia-ctk", "--version"]) is None:
        remedy = f"dnf install nvidia-container-toolkit && {CDI_GENERATE}"
    found = [(path, text) for path in CDI_SPECS if (text := host.read(path)) is not None]
    if not found:
        return fail(
            f"no CDI spec for the GPUs ({' nor '.join(CDI_SPECS)}): podman cannot resolve "
            "--device nvidia.com/gpu=all",
            remedy,
        )
    path, text = found[0]
    if "nvidia.com/gpu" not in text:
        return fail(f"{path} declares no nvidia.com/gpu devices", remedy)
    kernel = kernel_module_version(host)
    generated_for = sorted(set(_CDI_LIBRARY.findall(text)))
    if kernel is not None and generated_for and kernel not in generated_for:
        return fail(
            f"{path} was generated for driver {', '.join(generated_for)} but driver {kernel} "
            "is loaded: containers would mount libraries that are gone",
            remedy,
        )
    driver = f" for driver {', '.join(generated_for)}" if generated_for else ""
    return ok(f"{path} declares nvidia.com/gpu devices{driver}")


def check_podman(host: Host) -> CheckOutcome:
    result = host.run(["podman", "--version"])
    if result is None:
        return fail("podman not found: Triton runs under Podman", "dnf install podman")
    match = _PODMAN.search(result[1])
    if match is None:
        return warn(f"cannot read Podman's version: {first_line(result[1])}", "podman --version")
    version = match.group(0).removeprefix("podman version ")
    major_minor = (int(match.group(1)), int(match.group(2)))
    if major_minor < CDI_PODMAN:
        return fail(
            f"Podman {version} cannot pass CDI devices (--device nvidia.com/gpu=all needs 4.1)",
            f"dnf update podman ({_dotted(QUADLET_PODMAN)} or newer also runs the quadlets)",
        )
    if major_minor < QUADLET_PODMAN:
        return warn(
            f"Podman {version} is older than the quadlets' {_dotted(QUADLET_PODMAN)}: the "
            "recsys-*.container units may be refused or ignored",
            "use the plain units in deploy/systemd: copy them to /etc/systemd/system/, then "
            "systemctl daemon-reload && systemctl enable --now recsys-triton; or dnf update "
            f"podman (RHEL 8.10 ships {_dotted(QUADLET_PODMAN)})",
        )
    return ok(f"Podman {version} runs quadlets")


def check_overcommit(host: Host) -> CheckOutcome:
    value = host.read(OVERCOMMIT)
    if value is None:
        return warn(f"cannot read {OVERCOMMIT}", "sysctl vm.overcommit_memory")
    if value.strip() == "1":
        return ok("vm.overcommit_memory = 1")
    return warn(
        f"vm.overcommit_memory = {value.strip()}: large allocations under load (and Redis's "
        "background save, which forks) can fail",
        "echo 'vm.overcommit_memory = 1' >> /etc/sysctl.d/90-recsys.conf && "
        "sysctl -p /etc/sysctl.d/90-recsys.conf",
    )


HOST_ENV = "/etc/recsys/host.env"
_PIN = re.compile(r"^(RECSYS_\w+_PIN)=(.*)$", re.MULTILINE)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}")


def check_image_pins(host: Host) -> CheckOutcome:
    """Whether every registry image the units run is pinned by digest (host.env)."""
    text = host.read(HOST_ENV)
    if text is None:
        return fail(
            f"{HOST_ENV} is missing: the units read the images' digests and the API's address "
            "from it, and do not start without it",
            f"install -m 0644 deploy/host.env {HOST_ENV}, then deploy/tools/pin-images {HOST_ENV}",
        )
    pins = dict(_PIN.findall(text))
    unpinned = sorted(name for name, value in pins.items() if not _DIGEST.fullmatch(value))
    if unpinned:
        return warn(
            f"{', '.join(unpinned)} in {HOST_ENV} pin no digest: those images run by tag, "
            "and a tag moved on the registry changes what runs",
            f"deploy/tools/pin-images {HOST_ENV} (on a host that reaches the registries)",
        )
    return ok(f"{len(pins)} images pinned by digest ({HOST_ENV})")
