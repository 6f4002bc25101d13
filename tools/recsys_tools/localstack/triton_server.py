"""tritonserver on the CPU from the nvidia-pytriton wheel, with its Python backend."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as triton_grpc

from app.core.errors import ConfigError
from recsys_tools.localstack.ports import LOOPBACK
from recsys_tools.localstack.processes import (
    PROBE_TIMEOUT_S,
    Launch,
    ManagedProcess,
    project_root,
    start_managed_on_ports,
)


@dataclass(frozen=True, slots=True)
class TritonInstall:
    """Where the tritonserver of an environment with nvidia-pytriton lives."""

    env: Path
    root: Path
    python_version: str
    libdir: str

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        return (
            self.root
            / "python_backend_stubs"
            / self.python_version
            / ("triton_python_backend_stub")
        )


_PROBE = (
    "import sys, sysconfig; "
    "print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_config_var('LIBDIR'))"
)


def find_triton(env: Path) -> TritonInstall:
    python = env / "bin" / "python"
    found = sorted(env.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not python.exists() or not found:
        raise ConfigError(f"{env} is not a virtualenv with nvidia-pytriton; run `make setup`")
    probe = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, check=True)
    version, libdir = probe.stdout.split()
    return TritonInstall(env=env, root=found[0], python_version=version, libdir=libdir)


def _backend_directory(install: TritonInstall, workdir: Path) -> Path:
    """backends/python with the stub for the environment's Python, where Triton looks for it."""
    backends = workdir / "backends"
    python_backend = backends / "python"
    python_backend.mkdir(parents=True, exist_ok=True)
    source = install.root / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copyfile(source / name, python_backend / name)
    stub = python_backend / "triton_python_backend_stub"
    shutil.copyfile(install.stub, stub)
    stub.chmod(0o755)
    return backends


def _triton_env(install: TritonInstall) -> dict[str, str]:
    env = dict(os.environ)
    # The stub imports numpy and onnxruntime through the first python3 on PATH, and must link
    # the libpython of that same interpreter rather than whichever the loader finds first.
    env["PATH"] = f"{install.env / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    libs = [install.libdir, str(install.root.parent.parent / "nvidia_pytriton.libs")]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def triton_models_ready(url: str, models: Sequence[str]) -> bool:
    """Whether Triton at url serves and every one of models is ready."""
    # A fresh channel per probe: one kept across a restart would sit in reconnect backoff.
    client = triton_grpc.InferenceServerClient(url)
    try:
        return bool(client.is_server_ready(client_timeout=PROBE_TIMEOUT_S)) and all(
            client.is_model_ready(name, client_timeout=PROBE_TIMEOUT_S) for name in models
        )
    except Exception:  # not listening yet, or frozen: any client error means "not yet"
        return False
    finally:
        client.close()


def _triton_argv(
    install: TritonInstall,
    model_repository: Path,
    backends: Path,
    models: Sequence[str],
    ports: Mapping[str, int],
    model_control: bool,
) -> tuple[str, ...]:
    argv = [
        str(install.binary),
        f"--model-repository={model_repository.resolve()}",
        f"--backend-directory={backends}",
        f"--grpc-address={LOOPBACK}",
        f"--grpc-port={ports['grpc']}",
        "--exit-timeout-secs=5",
        "--log-verbose=0",
    ]
    # Mode "none" loads the whole repository at start and refuses load/unload requests, so
    # whoever reaches the port cannot swap the model; explicit control only when asked.
    if model_control:
        argv += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in models]]
    else:
        argv += ["--model-control-mode=none"]
    if "http" in ports:
        argv += [f"--http-address={LOOPBACK}", f"--http-port={ports['http']}"]
    else:
        argv += ["--allow-http=false"]
    if "metrics" in ports:
        argv += [f"--metrics-address={LOOPBACK}", f"--metrics-port={ports['metrics']}"]
    else:
        argv += ["--allow-metrics=false"]
    return tuple(argv)


def start_triton(
    env: Path,
    model_repository: Path,
    workdir: Path,
    models: list[str],
    timeout_s: float = 90.0,
    *,
    http: bool = False,
    metrics: bool = False,
    model_control: bool = False,
    extra: Sequence[str] = (),
) -> tuple[ManagedProcess, str]:
    """tritonserver on the CPU, on loopback; returns its gRPC address once `models` are ready.

    It serves gRPC, and HTTP and metrics when asked, each on a leased port: the process's
    `ports` name them ("grpc", "http", "metrics"). Without model control every model in the
    repository loads at start and `models` only names what to wait for; with
    `model_control=True` only `models` load, and clients may load and unload models (for
    tests that need it). `extra` are more of tritonserver's options
    (`--grpc-restricted-protocol=...`, say).
    """
    install = find_triton(env)
    backends = _backend_directory(install, workdir)
    names = tuple(models)
    endpoints = ["grpc", *(["http"] if http else []), *(["metrics"] if metrics else [])]

    def launch(ports: Mapping[str, int]) -> Launch:
        argv = _triton_argv(install, model_repository, backends, names, ports, model_control)
        url = f"{LOOPBACK}:{ports['grpc']}"
        ready = lambda: triton_models_ready(url, names)  # noqa: E731
        return Launch((*argv, *extra), _triton_env(install), ready, timeout_s)

    process = start_managed_on_ports("tritonserver", endpoints, launch, workdir / "triton.log")
    return process, f"{LOOPBACK}:{process.ports['grpc']}"


def default_triton_env() -> Path:
    return Path(os.environ.get("RECSYS_TRITON_ENV", project_root() / ".venv-triton"))
