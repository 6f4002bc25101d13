"""The house's rule, checked over the code's own imports: each package of app/ imports only
the floors below it, as do the tools' packages and the rooms of the world builder, and no
module of app/, the tools or the load generator is in a circle.

docs/architecture.md draws the floors; this test is what keeps them true.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# From the ground up: a package may import its own floor and those below, never above. The
# world's format (its files, their records) sits under what serves it.
FLOORS = (
    *("core", "world", "release", "clients", "pipeline"),
    *("process", "ingest", "archive", "api", ""),
)
# The tools, from the ground up: the command plumbing and the measuring helpers, the local
# servers, the world builder, the model tools, tuning, the doctor; the entry points on top.
TOOL_FLOORS = ("commands", "measure", "localstack", "world", "model", "tune", "doctor", "")
# The world builder's rooms, from the ground up: storing a world's files, reading an operator's
# tables, generating data, judging a world, learning one, the same learning as Spark jobs,
# the recipes that make one whole;
# its command line on top.
WORLD_FLOORS = ("store", "read", "generate", "judge", "learn", "spark", "recipes", "")
# Each top-level package, and the folder that holds it.
PACKAGES = {"app": ROOT, "recsys_tools": ROOT / "tools", "loadtest": ROOT}


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(top: str) -> dict[str, Path]:
    home = PACKAGES[top]
    return {_module_name(p, home): p for p in (home / top).rglob("*.py")}


def _imports(path: Path, name: str) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _graph(top: str) -> dict[str, set[str]]:
    modules = _modules(top)
    return {
        name: {target for target in _imports(path, name) if target in modules and target != name}
        for name, path in modules.items()
    }


def _floor(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 2 else ""  # app.X alone is a top-floor module
    if len(parts) == 2 and parts[1] in FLOORS:
        package = parts[1]  # the package's own __init__
    return FLOORS.index(package) if package in FLOORS else len(FLOORS) - 1


def _room(module: str, scope: str, floors: tuple[str, ...]) -> int | None:
    """The floor of `module` among `scope`'s floors; None outside the scope. A module directly
    in the scope is on the top floor unless a floor is named after it."""
    if not module.startswith(f"{scope}."):
        return None
    parts = module[len(scope) + 1 :].split(".")
    name = parts[0]
    return floors.index(name) if name in floors else len(floors) - 1


def _upward(top: str, scope: str, floors: tuple[str, ...]) -> list[str]:
    upward = []
    for source, targets in _graph(top).items():
        for target in targets:
            here, there = _room(source, scope, floors), _room(target, scope, floors)
            if here is not None and there is not None and there > here:
                upward.append(f"{source} -> {target}")
    return upward


@pytest.mark.parametrize(
    ("scope", "floors"),
    [("recsys_tools", TOOL_FLOORS), ("recsys_tools.world", WORLD_FLOORS)],
)
def test_no_import_in_the_tools_runs_up_a_floor(scope: str, floors: tuple[str, ...]) -> None:
    upward = _upward("recsys_tools", scope, floors)
    assert not upward, "imports that run up (docs/architecture.md):\n" + "\n".join(upward)


def test_every_room_of_the_world_builder_is_a_floor() -> None:
    # A new folder in world/ is a new room: it gets its place in WORLD_FLOORS, or it is a
    # module of the command line on top.
    world = ROOT / "tools" / "recsys_tools" / "world"
    rooms = {p.name for p in world.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(WORLD_FLOORS) - {""}


def test_every_module_of_app_lives_on_a_floor() -> None:
    # The top floor holds the entry points only; everything else lives in a package.
    top = {"app", "app.main", "app.cli", "app.__main__"}
    housed = (*FLOORS, "defaults")
    strays = [
        name for name in _modules("app") if name not in top and name.split(".")[1] not in housed
    ]
    assert not strays, f"{strays}: put each in a package of docs/architecture.md"


def test_no_import_in_app_runs_up_a_floor() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in _graph("app").items()
        for target in targets
        if _floor(target) > _floor(source)
    ]
    assert not upward, "imports that run up (docs/architecture.md):\n" + "\n".join(upward)


# The third-party clients of the service's dependencies: their errors are mapped into the
# service's own in app/clients/, so only that floor imports them.
DEPENDENCY_CLIENTS = ("redis", "tritonclient")


def test_only_the_clients_floor_talks_to_redis_and_triton() -> None:
    talking = [
        f"{name} imports {target}"
        for name, path in _modules("app").items()
        if not name.startswith("app.clients.")
        for target in _imports(path, name)
        if target.split(".")[0] in DEPENDENCY_CLIENTS
    ]
    assert not talking, "through a client in app/clients/ instead:\n" + "\n".join(talking)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("top", sorted(PACKAGES))
def test_no_module_is_in_an_import_circle(top: str) -> None:
    graph = _graph(top)
    # A package's __init__ naming its own modules is its table of contents, not a dependency.
    for name in graph:
        if _modules(top)[name].name == "__init__.py":
            graph[name] = {t for t in graph[name] if not t.startswith(f"{name}.")}
    circle = _cycle(graph)
    assert circle is None, " -> ".join(circle or [])


def test_the_check_sees_an_upward_import() -> None:
    # The rule above is only as good as the reading of imports: a planted arrow is found.
    assert _floor("app.core.metrics") < _floor("app.pipeline.context")
    assert "app.core.vocabulary" in _graph("app")["app.core.metrics"]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    world = "recsys_tools.world"
    assert _room(f"{world}.store.catalog", world, WORLD_FLOORS) == 0
    assert _room(f"{world}.commands", world, WORLD_FLOORS) == len(WORLD_FLOORS) - 1
    assert "recsys_tools.world.store.world" in _graph("recsys_tools")[f"{world}.recipes.demo"]
