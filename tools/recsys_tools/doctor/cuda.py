"""Whether the host driver's CUDA version is enough for the Triton image the unit runs.

An NGC Triton image carries its own CUDA runtime, which needs a driver at least as new as
that CUDA release. `nvidia-smi` prints the newest CUDA the driver supports ("CUDA Version:
12.4" in its header). Exception: data-center GPUs (T4, L4, A10, A100, H100, ...) on the
forward-compatible driver branches R470, R525, R535 and R545 run newer images through the CUDA
forward-compatibility package inside the image, so there "below" may still work; the finding
says so, and the container log says whether compatibility mode is enabled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from recsys_tools.doctor.checks import kernel_module_version
from recsys_tools.doctor.findings import CheckOutcome, fail, ok, warn
from recsys_tools.doctor.host import Host
from recsys_tools.doctor.units import TritonUnit, triton_image

Version = tuple[int, int]

# Triton container release (YY.MM) -> the CUDA release it is built on, from the "Driver
# Requirements" section of each release's notes ("Release 24.10 is based on CUDA 12.6.2 which
# requires NVIDIA Driver release 560 or later"), docs.nvidia.com/deeplearning/
# triton-inference-server/release-notes/rel-YY-MM.html. Releases missing here were not looked
# up; a missing release between two with the same CUDA is taken to have it too.
TRITON_CUDA: dict[Version, Version] = {
    (22, 9): (11, 8),
    (22, 10): (11, 8),
    (22, 12): (11, 8),
    (23, 4): (12, 1),
    (23, 5): (12, 1),
    (23, 6): (12, 1),
    (23, 7): (12, 1),
    (23, 8): (12, 2),
    (23, 9): (12, 2),
    (23, 10): (12, 2),
    (23, 11): (12, 3),
    (23, 12): (12, 3),
    (24, 1): (12, 3),
    (24, 3): (12, 4),
    (24, 4): (12, 4),
    (24, 5): (12, 4),
    (24, 6): (12, 5),
    (24, 7): (12, 5),
    (24, 8): (12, 6),
    (24, 10): (12, 6),
    (24, 12): (12, 6),
    (25, 1): (12, 8),
    (25, 2): (12, 8),
    (25, 3): (12, 8),
    (25, 4): (12, 9),
    (25, 6): (12, 9),
    (25, 8): (13, 0),
    (25, 10): (13, 0),
    (26, 2): (13, 1),
    (26, 4): (13, 2),
    (26, 6): (13, 3),
    (26, 8): (13, 4),
    (26, 10): (13, 4),
}

# Driver branch -> the newest CUDA it supports (what nvidia-smi's header shows), per the CUDA
# Toolkit release notes' table of minimum driver versions. Used when nvidia-smi cannot say.
DRIVER_CUDA: dict[int, Version] = {
    470: (11, 4),
    520: (11, 8),
    525: (12, 0),
    530: (12, 1),
    535: (12, 2),
    545: (12, 3),
    550: (12, 4),
    555: (12, 5),
    560: (12, 6),
    565: (12, 7),
    570: (12, 8),
    575: (12, 9),
    580: (13, 0),
}

_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True)
class Requirement:
    cuda: Version
    exact: bool  # False: only a lower bound (the release is not in the table)


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def release_tag(release: Version) -> str:
    return f"{release[0]:02d}.{release[1]:02d}"


def required_cuda(release: Version) -> Requirement | None:
    """The CUDA a Triton release needs; None for releases older than the table."""
    if release in TRITON_CUDA:
        return Requirement(TRITON_CUDA[release], True)
    before = [r for r in TRITON_CUDA if r < release]
    after = [r for r in TRITON_CUDA if r > release]
    if not before:
        return None
    lower = TRITON_CUDA[max(before)]
    # CUDA only moves forward from one release to the next.
    exact = bool(after) and TRITON_CUDA[min(after)] == lower
    return Requirement(lower, exact)


def minimum_branch(cuda: Version) -> int | None:
    branches = [branch for branch, supported in DRIVER_CUDA.items() if supported >= cuda]
    return min(branches) if branches else None


def newest_release_for(cuda: Version) -> Version | None:
    fitting = [release for release, needed in TRITON_CUDA.items() if needed <= cuda]
    return max(fitting) if fitting else None


def driver_cuda(host: Host) -> tuple[Version, str] | None:
    """The newest CUDA the driver supports, and where that came from."""
    smi = host.run(["nvidia-smi"])
    if smi is not None and smi[0] == 0:
        match = _SMI_CUDA.search(smi[1])
        if match:
            return (int(match.group(1)), int(match.group(2))), "nvidia-smi"
    kernel = kernel_module_version(host)
    if kernel is None:
        return None
    branch = int(kernel.split(".")[0])
    known = [b for b in DRIVER_CUDA if b <= branch]
    if not known:
        return None
    return DRIVER_CUDA[max(known)], f"driver {kernel}"


def check_cuda_for_triton(host: Host, unit: TritonUnit | None, looked_in: str = "") -> CheckOutcome:
    if unit is None:
        return warn(
            f"no Triton unit found{looked_in and f' in {looked_in}'}: cannot tell which "
            "Triton release this host must run",
            "install deploy/quadlet/recsys-triton.container into /etc/containers/systemd/, "
            "or pass --units DIR",
        )
    image = triton_image(unit)
    if image is None:
        return warn(
            f"{unit.path} runs no nvcr.io/nvidia/tritonserver:YY.MM image",
            f"set Image=nvcr.io/nvidia/tritonserver:YY.MM-py3 in {unit.path}",
        )
    name, release = image
    tag = release_tag(release)
    need = required_cuda(release)
    if need is None:
        return warn(
            f"{name} is older than the releases this check knows",
            f"compare its release notes' Driver Requirements with nvidia-smi; {unit.path}",
        )
    have = driver_cuda(host)
    if have is None:
        return warn(
            f"cannot tell the driver's CUDA version ({name} needs CUDA {dotted(need.cuda)})",
            "see the nvidia-driver check; nvidia-smi prints it in its header",
        )
    supported, source = have
    if supported < need.cuda:
        branch = minimum_branch(need.cuda)
        driver = f"driver R{branch} or later" if branch else "a newer driver"
        fitting = newest_release_for(supported)
        alternative = (
            f", or set Image=nvcr.io/nvidia/tritonserver:{release_tag(fitting)}-py3 in "
            f"{unit.path} (built on CUDA {dotted(TRITON_CUDA[fitting])})"
            if fitting
            else ""
        )
        return fail(
            f"the driver supports CUDA {dotted(supported)} ({source}) but {name} "
            f"({unit.path}) needs CUDA {dotted(need.cuda)}",
            f"install {driver} (dnf install cuda-drivers, reboot){alternative}. Data-center "
            "GPUs on R470/R525/R535/R545 may run it in CUDA forward-compatibility mode: the "
            "container log says so",
        )
    if not need.exact:
        return warn(
            f"Triton {tag} is not in this check's table; releases before it need CUDA "
            f"{dotted(need.cuda)}, the driver supports {dotted(supported)}",
            f"compare the Driver Requirements in Triton {tag}'s release notes with nvidia-smi",
        )
    return ok(f"the driver supports CUDA {dotted(supported)}; {name} needs {dotted(need.cuda)}")
