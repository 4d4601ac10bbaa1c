"""No flag without a reader (docs/design.md §4): every ``AlgorithmConfig`` / ``RunConfig`` field and
every capability attribute is read by code that runs, not only parsed and validated.

An AST scan of ``relax/``. What counts as a read:

- a config field: ``<x>.<field>`` loaded, where ``<x>`` is a configuration object by name
  (``config``, ``cfg``, ``c``, ``a``, ``run_config``, or an attribute chain ending in ``.config`` /
  ``.algorithm``; ``self`` only inside ``relax/config/run.py``, whose derived properties such as
  ``staleness_bound`` are read in turn), or ``getattr(<x>, "<field>")`` with a literal name. The
  fields are ``RunConfig``'s and those of every built-in method's ``Config``;
- a capability: ``<anything>.<capability>`` loaded (the names are distinctive).

What does not count: ``relax/cli`` (parsing, building, messages), the declarations
(``relax/config/``, ``relax/algorithms/capabilities.py``), and, for configuration fields,
``relax/runtime/checks/validation.py`` and its rule modules (method, reward, engine rules): a rule that
checks a flag is not an effect of the flag. For
capabilities the rules *are* the effect (``requires_rewards_normalization`` refuses a switch), and
``relax.runtime.driver.train.run`` applies them on every entry point, which the last test checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import attrs

from relax.algorithms import BUILTIN_ALGORITHMS
from relax.algorithms.capabilities import CAPABILITIES
from relax.config.run import RunConfig
from relax.config.sft import SftConfig

ROOT = Path(__file__).resolve().parents[2] / "relax"
DECLARATIONS = {"config/fields.py", "config/algorithm.py", "config/__init__.py", "algorithms/capabilities.py"}
VALIDATION = {f"runtime/checks/{name}.py" for name in ("validation", "method_rules", "reward_rules", "engine_rules")}
CONFIG_NAMES = {"config", "cfg", "c", "a", "run_config", "algorithm", "sft"}

# RunConfig's fields, every built-in method's Config fields (the shared AlgorithmConfig's included) and
# relax sft's SftConfig
_CONFIGS = {cls.Config for cls in BUILTIN_ALGORITHMS} | {p.Config for cls in BUILTIN_ALGORITHMS
                                                          for p in getattr(cls, "PRESETS", {}).values()}
FIELDS = {f.name for config in _CONFIGS for f in attrs.fields(config)} | {f.name for f in attrs.fields(RunConfig)}
FIELDS |= {f.name for f in attrs.fields(SftConfig)}  # relax sft's own flags
FIELDS -= {"algorithm"}  # RunConfig.algorithm is the AlgorithmConfig itself, not a flag

# Explicit exceptions, each with its reason. Keep this empty unless a field truly has no reader by
# design (and then say why here).
EXCEPTIONS: dict[str, str] = {}


def _is_config(node: ast.expr, rel: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES or (node.id == "self" and rel == "config/run.py")
    if isinstance(node, ast.Attribute):
        return node.attr in ("config", "algorithm")
    return False


def readers(root: Path = ROOT, skip: frozenset = frozenset()) -> tuple[dict[str, set], dict[str, set]]:
    """-> ``({field: {files}}, {capability: {files}})`` of the reads outside the CLI and declarations."""
    fields: dict[str, set] = {}
    caps: dict[str, set] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("cli/") or rel in DECLARATIONS or rel in skip:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                if node.attr in CAPABILITIES:
                    caps.setdefault(node.attr, set()).add(rel)
                if node.attr in FIELDS and rel not in VALIDATION and _is_config(node.value, rel):
                    fields.setdefault(node.attr, set()).add(rel)
            if isinstance(node, ast.Call) and node.args and rel not in VALIDATION:
                func = node.func
                literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
                    names = literal[:1] if _is_config(node.args[0], rel) else []
                else:
                    names = []
                for name in names:
                    if name in FIELDS:
                        fields.setdefault(name, set()).add(rel)
    return fields, caps


def test_every_config_field_is_read_outside_the_cli():
    fields, _ = readers()
    silent = sorted(FIELDS - set(fields) - set(EXCEPTIONS))
    assert not silent, (
        f"configuration fields read by nothing outside relax/cli and the validation rules: {silent}. Give "
        "each a reader at run time (docs/design.md, 'Add a flag'), or remove the flag"
    )


def test_every_capability_is_read_outside_the_cli():
    _, caps = readers()
    silent = sorted(set(CAPABILITIES) - set(caps))
    assert not silent, f"capability attributes read by nothing outside relax/cli: {silent}; consume or remove them"


def test_exceptions_are_real_fields_still_without_a_reader():
    fields, _ = readers()
    assert set(EXCEPTIONS) <= FIELDS
    assert not set(EXCEPTIONS) & set(fields), "an exception got a reader: remove it from EXCEPTIONS"


def test_the_scan_catches_a_switch_that_is_only_validated():
    # Without the rollout worker, --disable-rewards-normalization is read only by the validation rules
    # (and the CLI), and the hooks and dynamic-sampling flags by nothing: the scan must say so.
    fields, _ = readers(skip=frozenset({"runtime/step/rollout_worker.py"}))
    for name in ("rewards_normalization", "max_sampling_rounds", "over_sampling_batch_size"):
        assert name not in fields, name



def test_only_reads_of_configuration_objects_count(tmp_path):
    (tmp_path / "other.py").write_text(
        "def f(self, engine, torch):\n    return self.lr, torch.load, engine.seed, getattr(engine, 'task')\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "main.py").write_text("def g(config):\n    return config.seed\n")
    assert readers(tmp_path) == ({}, {})
    (tmp_path / "reader.py").write_text(
        "def g(config, algorithm_cls):\n    return config.algorithm.kl_coef, getattr(config, 'seed'), "
        "algorithm_cls.needs_critic\n")
    assert readers(tmp_path) == ({"kl_coef": {"reader.py"}, "seed": {"reader.py"}}, {"needs_critic": {"reader.py"}})


def test_run_applies_the_validation_rules():
    tree = ast.parse((ROOT / "runtime" / "driver" / "train.py").read_text())
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "run")
    calls = {n.func.id for n in ast.walk(run) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "Run" in calls  # run() is its Run's phases; the first of them checks the configuration
    phases = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Run")
    calls = {n.func.id for n in ast.walk(phases) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "validate" in calls
