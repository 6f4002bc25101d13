"""The house's rule, checked over the code's own imports: each package of app/ imports only
the floors below it, and no module of app/, the tools or the load generator is in a circle.

docs/architecture.md draws the floors; this test is what keeps them true.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# From the ground up: a package may import its own floor and those below, never above.
FLOORS = ("core", "release", "clients", "pipeline", "process", "ingest", "api", "")
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
