"""The package layers import only downward (docs/design.md, "Layers"):

    config -> algorithms -> models -> rollout | backends -> runtime -> cli

``config`` (the run's settings and the shared hyper-parameters, with their flags and rules) is the
bottom: every layer that reads a setting imports its type. rollout and backends sit side by side and
never import each other. ``relax.importing`` (the one ``module:attr`` loader) is below everything. Function-local imports count too: a lazy import up a
layer is still a dependency up a layer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "relax"

ALLOWED = {
    "config": {"config"},
    "algorithms": {"config", "algorithms", "importing"},
    "models": {"config", "algorithms", "models", "importing"},
    "rollout": {"config", "algorithms", "models", "rollout", "importing"},
    "backends": {"config", "algorithms", "models", "backends", "importing"},
    "runtime": {"config", "algorithms", "models", "rollout", "backends", "runtime", "importing"},
    # `relax sft` runs its recipe (relax.recipes.sft); no recipe imports the CLI
    "cli": {"config", "algorithms", "models", "rollout", "backends", "runtime", "cli", "recipes", "importing"},
    # runnable recipes (the single-process recipe, the tiny models' warm-ups, relax sft's loop) sit on top, beside cli
    "recipes": {"config", "algorithms", "models", "rollout", "backends", "runtime", "recipes", "importing"},
    # ready-made reward functions (--custom-rm-path relax.rewards.math:score): user-level code that
    # stands on the reward contract alone and imports no other layer
    "rewards": {"rewards", "importing"},
}


def _imported_names(path: Path) -> set[tuple[str, int]]:
    """``(dotted module name, line)`` of every absolute import in ``path``; ``from pkg import a`` counts
    as ``pkg.a`` where ``pkg`` is ``relax`` or ``relax.runtime`` (a layer or a room imported by name)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module in ("relax", "relax.runtime"):  # ``from relax import rollout``
                names = [f"{node.module}.{a.name}" for a in node.names]
        out |= {(name, node.lineno) for name in names}
    return out


def _relax_imports(path: Path) -> set[tuple[str, int]]:
    """``(first package under relax, line)`` of every ``relax.*`` import in ``path``."""
    return {(name.split(".")[1], line) for name, line in _imported_names(path)
            if name.split(".")[0] == "relax" and "." in name}


def _modules(layer: str):
    base = ROOT / layer
    return sorted(base.rglob("*.py")) if base.is_dir() else [ROOT / f"{layer}.py"]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_point_downward(layer):
    offending = [
        f"{path.relative_to(ROOT.parent)}:{line} imports relax.{target}"
        for path in _modules(layer)
        for target, line in sorted(_relax_imports(path))
        if target not in ALLOWED[layer]
    ]
    assert not offending, "imports up a layer (or sideways between rollout and backends):\n" + "\n".join(offending)


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(ALLOWED), f"packages without a layer in this test: {packages - set(ALLOWED)}"


def test_the_checker_sees_lazy_and_package_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from relax.runtime.driver.train import run\n\nfrom relax import rollout\nimport relax.cli.main\n")
    assert {t for t, _ in _relax_imports(module)} == {"runtime", "rollout", "cli"}


BACKEND_NAME_BRANCH = re.compile(r"""backend\s*[!=]=\s*["']|["'](torch|megatron)["']\s*(==|!=|in\b)""")


def test_no_backend_name_branch_outside_backends():
    """The runtime asks the backend class (relax.backends.registry), never compares its name."""
    hits = [
        f"{path.relative_to(ROOT.parent)}:{i}: {line.strip()}"
        for path in sorted(ROOT.rglob("*.py"))
        if "backends" not in path.relative_to(ROOT).parts
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if BACKEND_NAME_BRANCH.search(line)
    ]
    assert not hits, "backend-name branches outside relax/backends:\n" + "\n".join(hits)


# The runtime's rooms (docs/design.md, "The runtime's rooms"), bottom first: a room imports only
# itself and the rooms below it.
RUNTIME_ROOMS = ("data", "metrics", "weights", "step", "files", "checks", "preflight", "session", "cluster", "driver")
RUNTIME = ROOT / "runtime"
MAX_MODULES_PER_ROOM = 12


def _runtime_imports(path: Path) -> set[tuple[str, int]]:
    """``(room, line)`` of every ``relax.runtime.<room>`` import in ``path``, lazy ones included."""
    return {(name.split(".")[2], line) for name, line in _imported_names(path)
            if name.split(".")[:2] == ["relax", "runtime"] and name.count(".") >= 2}


def test_the_runtime_is_its_rooms():
    """Every runtime module lives in a room, directly; each room is a package of at most 12 modules."""
    loose = sorted(p.name for p in RUNTIME.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in relax/runtime (put each into its room): {loose}"
    rooms = {p.name for p in RUNTIME.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(RUNTIME_ROOMS), f"rooms on disk {sorted(rooms)} differ from RUNTIME_ROOMS"
    for room in RUNTIME_ROOMS:
        nested = [p.name for p in (RUNTIME / room).iterdir() if (p / "__init__.py").exists()]
        assert not nested, f"relax/runtime/{room} has sub-packages {nested}: a room is one level"
        modules = [p for p in (RUNTIME / room).glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES_PER_ROOM, f"relax/runtime/{room} has {len(modules)} modules"


@pytest.mark.parametrize("room", RUNTIME_ROOMS)
def test_runtime_rooms_import_downward(room):
    allowed = set(RUNTIME_ROOMS[: RUNTIME_ROOMS.index(room) + 1])
    offending = [
        f"{path.relative_to(ROOT.parent)}:{line} imports relax.runtime.{target}"
        for path in sorted((RUNTIME / room).rglob("*.py"))
        for target, line in sorted(_runtime_imports(path))
        if target not in allowed
    ]
    assert not offending, f"relax/runtime/{room} imports a room above it:\n" + "\n".join(offending)


def _module_graph() -> dict[str, set[str]]:
    """relax's modules -> the relax modules each imports (lazy imports included, ``TYPE_CHECKING``
    blocks left out: they never run)."""
    paths = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        targets = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                            for a in node.names}
        graph[module] = {r for t in targets if t.startswith("relax") and (r := resolve(t)) and r != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_import_circle_in_relax():
    circles = _circles(_module_graph())
    assert not circles, "modules that import each other (directly or around a circle):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
