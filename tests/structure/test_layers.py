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
    "cli": {"config", "algorithms", "models", "rollout", "backends", "runtime", "cli", "importing"},
    # runnable recipes (the single-process loop, the tiny model's warm-up) sit on top, beside cli
    "recipes": {"config", "algorithms", "models", "rollout", "backends", "runtime", "recipes", "importing"},
    # ready-made reward functions (--custom-rm-path relax.rewards.math:score): user-level code that
    # stands on the reward contract alone and imports no other layer
    "rewards": {"rewards", "importing"},
}


def _relax_imports(path: Path) -> set[tuple[str, int]]:
    """``(first package under relax, line)`` of every ``relax.*`` import in ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "relax":  # ``from relax import rollout``
                names = [f"relax.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "relax" and len(parts) > 1:
                out.add((parts[1], node.lineno))
    return out


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
    module.write_text("def f():\n    from relax.runtime.train import run\n\nfrom relax import rollout\nimport relax.cli.main\n")
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
