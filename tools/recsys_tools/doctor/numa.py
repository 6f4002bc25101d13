"""Whether Triton runs on the NUMA node of its GPU.

Across nodes every host-to-GPU copy and every page Triton touches crosses the interconnect,
which shows as p99 jitter. The GPU's node is in sysfs; the pinning is in the unit or its
drop-ins: CPUAffinity=/AllowedCPUs= (CPUs), NUMAMask=/AllowedMemoryNodes= (nodes), numactl
--cpunodebind/--membind/--physcpubind in a command line, or podman's --cpuset-cpus/-mems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from recsys_tools.doctor.findings import CheckOutcome, fail, ok, warn
from recsys_tools.doctor.host import Host
from recsys_tools.doctor.units import SYSTEMD_DIR, TRITON_SERVICE, TritonUnit, gpu_index
from recsys_tools.doctor.units import logical_lines as unit_lines

NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASS = "0x03"  # PCI base class 03: VGA (0x0300xx) and 3D controllers (0x0302xx)

_NODE_DIR = re.compile(r"/node(\d+)$")
_CPU_KEYS = ("CPUAffinity", "AllowedCPUs")
_NODE_KEYS = ("NUMAMask", "AllowedMemoryNodes")
_KEY_LINE = re.compile(r"(" + "|".join(_CPU_KEYS + _NODE_KEYS) + r")\s*=\s*(.*)$")
_CPUSET = re.compile(r"--cpuset-(cpus|mems)(?:=|\s+)(\S+)")
_NUMACTL_NODES = ("--cpunodebind", "-N", "--membind", "-m", "--preferred", "-p")
_NUMACTL_CPUS = ("--physcpubind", "-C")


@dataclass(frozen=True, slots=True)
class Gpu:
    bus_id: str
    node: int | None  # None: sysfs gives none (-1 on hosts whose firmware does not say)


@dataclass(frozen=True, slots=True)
class Pinning:
    nodes: frozenset[int]
    settings: tuple[str, ...]  # "file: setting", to name in the finding


def parse_list(text: str, every: frozenset[int] = frozenset()) -> set[int]:
    """A kernel/systemd list: "0-15,32-47", "0 2", "all"."""
    values: set[int] = set()
    for token in re.split(r"[\s,]+", text.strip().strip("'\"")):
        if not token:
            continue
        if token == "all":
            values |= every
        elif "-" in token:
            low, high = token.split("-", 1)
            values.update(range(int(low), int(high) + 1))
        else:
            values.add(int(token))
    return values


def numa_nodes(host: Host) -> dict[int, tuple[str, frozenset[int]]]:
    """Node -> (its cpulist as written, its CPUs)."""
    nodes: dict[int, tuple[str, frozenset[int]]] = {}
    for path in host.glob("/sys/devices/system/node/node*"):
        match = _NODE_DIR.search(path)
        if match:
            cpulist = (host.read(f"{path}/cpulist") or "").strip()
            nodes[int(match.group(1))] = (cpulist, frozenset(parse_list(cpulist)))
    return nodes


def nvidia_gpus(host: Host) -> list[Gpu]:
    """NVIDIA display/3D controllers on the PCI bus, in bus order (nvidia-smi's index order)."""
    gpus: list[Gpu] = []
    for path in host.glob("/sys/bus/pci/devices/*"):
        vendor = (host.read(f"{path}/vendor") or "").strip().lower()
        pci_class = (host.read(f"{path}/class") or "").strip().lower()
        if vendor != NVIDIA_VENDOR or not pci_class.startswith(DISPLAY_CLASS):
            continue
        raw = (host.read(f"{path}/numa_node") or "").strip()
        node = int(raw) if raw.lstrip("-").isdigit() and int(raw) >= 0 else None
        gpus.append(Gpu(path.rsplit("/", 1)[-1], node))
    return sorted(gpus, key=lambda gpu: gpu.bus_id)


def _numactl(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Node lists and CPU lists given to numactl in one command line."""
    nodes: list[str] = []
    cpus: list[str] = []
    start = next(i for i, t in enumerate(tokens) if t.rsplit("/", 1)[-1] == "numactl")
    i = start + 1
    while i < len(tokens) and tokens[i].startswith("-"):
        token = tokens[i]
        name, equals, value = token.partition("=")
        if not equals and not token.startswith("--") and len(token) > 2:
            name, value, equals = token[:2], token[2:], "attached"
        if name in _NUMACTL_NODES + _NUMACTL_CPUS and not equals and i + 1 < len(tokens):
            i += 1
            value = tokens[i]
        if name in _NUMACTL_NODES:
            nodes.append(value)
        elif name in _NUMACTL_CPUS:
            cpus.append(value)
        i += 1
    return nodes, cpus


def unit_pinning(unit: TritonUnit, nodes: dict[int, tuple[str, frozenset[int]]]) -> Pinning:
    every_node = frozenset(nodes)
    every_cpu = frozenset().union(*(cpus for _, cpus in nodes.values()))
    pinned_nodes: set[int] = set()
    settings: list[str] = []
    for file in unit.files:
        for line in unit_lines(file.text):
            found_nodes: list[str] = []
            found_cpus: list[str] = []
            key = _KEY_LINE.match(line)
            if key and key.group(2).strip() not in ("", "numa"):
                target = found_cpus if key.group(1) in _CPU_KEYS else found_nodes
                target.append(key.group(2))
            for kind, value in _CPUSET.findall(line):
                (found_cpus if kind == "cpus" else found_nodes).append(value)
            tokens = line.split()
            if any(t.rsplit("/", 1)[-1] == "numactl" for t in tokens):
                more_nodes, more_cpus = _numactl(tokens)
                found_nodes += more_nodes
                found_cpus += more_cpus
            try:
                for value in found_nodes:
                    pinned_nodes |= parse_list(value, every_node)
                for value in found_cpus:
                    cpus = parse_list(value, every_cpu)
                    pinned_nodes |= {n for n, (_, on_node) in nodes.items() if on_node & cpus}
            except ValueError as exc:
                raise ValueError(f"{file.path}: {line!r} is not a list of numbers") from exc
            if found_nodes or found_cpus:
                settings.append(f"{file.path}: {line}")
    return Pinning(frozenset(pinned_nodes), tuple(settings))


def _dropin_remedy(node: int, cpulist: str) -> str:
    directory = f"{SYSTEMD_DIR}/{TRITON_SERVICE}.d"
    return (
        f"mkdir -p {directory} && printf '[Service]\\nCPUAffinity={cpulist}\\n"
        f"NUMAPolicy=bind\\nNUMAMask={node}\\n' > {directory}/10-numa.conf && "
        "systemctl daemon-reload && systemctl restart recsys-triton"
    )


def _repin(node: int, cpulist: str, pinning: Pinning, how: str) -> str:
    # Edit the existing settings: another drop-in would not replace them (CPUAffinity=
    # assignments merge, and a numactl in a command line stays).
    files = sorted({setting.split(": ", 1)[0] for setting in pinning.settings})
    return (
        f"pin it to node {node} {how} in {', '.join(files)}: CPUAffinity={cpulist} and "
        f"NUMAMask={node} (or numactl --cpunodebind={node} --membind={node} in a command "
        "line), then systemctl daemon-reload && systemctl restart recsys-triton"
    )


def _names(values: frozenset[int]) -> str:
    return ",".join(str(v) for v in sorted(values))


def check_numa(host: Host, unit: TritonUnit | None, looked_in: str = "") -> CheckOutcome:
    nodes = numa_nodes(host)
    if not nodes:
        return warn(
            "no NUMA nodes under /sys/devices/system/node: cannot check Triton's placement",
            "run on the host itself, not in a container, or pass --root",
        )
    if len(nodes) == 1:
        return ok("one NUMA node: nothing to pin")
    gpus = nvidia_gpus(host)
    if not gpus:
        return warn(
            f"{len(nodes)} NUMA nodes, but no NVIDIA GPU under /sys/bus/pci/devices",
            "lspci -d 10de: lists the GPUs; see the nvidia-driver check",
        )
    if unit is None:
        return warn(
            f"{len(nodes)} NUMA nodes and no Triton unit found"
            f"{looked_in and f' in {looked_in}'} to check the pinning of",
            "install deploy/quadlet/recsys-triton.container into /etc/containers/systemd/, "
            "or pass --units DIR",
        )
    index = gpu_index(unit)
    if index >= len(gpus):
        return warn(
            f"{unit.path} gives Triton GPU {index}, but the host has {len(gpus)}",
            f"fix nvidia.com/gpu= in {unit.path}",
        )
    gpu = gpus[index]
    if gpu.node is None:
        return warn(
            f"GPU {index} ({gpu.bus_id}) reports no NUMA node: the firmware does not say",
            "nvidia-smi topo -m shows the GPU's CPU affinity; pin Triton to it by hand",
        )
    cpulist = nodes.get(gpu.node, ("", frozenset()))[0]
    remedy = _dropin_remedy(gpu.node, cpulist)
    try:
        pinning = unit_pinning(unit, nodes)
    except ValueError as exc:
        return warn(
            f"cannot read Triton's pinning: {exc}",
            f"write the CPUs or nodes as numbers (for GPU {index}'s node: CPUAffinity={cpulist} "
            f"NUMAMask={gpu.node}); systemd specifiers are not expanded here",
        )
    where = f"GPU {index} ({gpu.bus_id}) is on NUMA node {gpu.node} of {len(nodes)}"
    spread = {g.node for g in gpus if g.node is not None}
    if len(spread) > 1:
        where += (
            f" (the GPUs span nodes {_names(frozenset(spread))}; the model's instances run on "
            "the container's GPU 0)"
        )
    if not pinning.nodes:
        return warn(f"{where}, and {unit.path} does not pin Triton to it", remedy)
    if gpu.node not in pinning.nodes:
        return fail(
            f"{where}, but Triton is pinned to node {_names(pinning.nodes)} "
            f"({'; '.join(pinning.settings)})",
            _repin(gpu.node, cpulist, pinning, "instead"),
        )
    if pinning.nodes != {gpu.node}:
        return warn(
            f"{where}; Triton is pinned to nodes {_names(pinning.nodes)}, not only to it",
            _repin(gpu.node, cpulist, pinning, "alone"),
        )
    return ok(f"{where}, and Triton is pinned to it")
