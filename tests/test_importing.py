"""relax.importing.load_attribute: the one loader of ``package.module:attribute`` specs."""

import json
import subprocess
import sys
import textwrap
import uuid

import pytest

from relax.importing import load_attribute

MODULE = """
LIMIT = 3

def score(prompt, completion, label, metadata):
    return 1.0

class Helper:
    pass

def _private():
    pass
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A good module, one that raises while importing, and one whose dependency is missing."""
    tag = uuid.uuid4().hex[:8]
    names = {"good": f"relax_load_good_{tag}", "raises": f"relax_load_raises_{tag}",
             "needs": f"relax_load_needs_{tag}"}
    (tmp_path / f"{names['good']}.py").write_text(MODULE)
    (tmp_path / f"{names['raises']}.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / f"{names['needs']}.py").write_text("import relax_no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield names
    for name in names.values():
        sys.modules.pop(name, None)


def test_loads_the_attribute(modules):
    good = modules["good"]
    assert load_attribute(f"{good}:score").__name__ == "score"
    assert load_attribute(f"{good}:LIMIT", "--flag") == 3  # any attribute, not only callables
    assert load_attribute(f"{good}.score", allow_dotted=True).__name__ == "score"
    assert load_attribute("json:dumps") is json.dumps


@pytest.mark.parametrize("spec", ["a:b:c", ":score", "mod:", "nodots"])
def test_malformed_spec_names_the_flag_and_the_expected_form(spec):
    with pytest.raises(ValueError) as info:
        load_attribute(spec, "--my-hook", expected="'package.module:function'", allow_dotted=True)
    assert str(info.value) == f"--my-hook {spec!r} is malformed: expected 'package.module:function'"


def test_dotted_form_only_when_allowed(modules):
    with pytest.raises(ValueError, match="is malformed"):
        load_attribute(f"{modules['good']}.score", "--flag")


@pytest.mark.parametrize("spec", ["", "   ", None])
def test_empty_spec(spec):
    with pytest.raises(ValueError, match=r"^--flag needs 'package\.module:attribute', got"):
        load_attribute(spec, "--flag")
    with pytest.raises(ValueError, match=r"^Expected 'package\.module:attribute', got"):
        load_attribute(spec)


def test_module_not_found_says_so_with_the_spec_and_the_flag():
    with pytest.raises(ValueError) as info:
        load_attribute("relax_no_such_module_xyz.sub:thing", "--flag")
    msg = str(info.value)
    assert msg.startswith(
        "--flag 'relax_no_such_module_xyz.sub:thing': cannot import module 'relax_no_such_module_xyz.sub'"
    )
    assert "PYTHONPATH" in msg
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_without_a_flag_the_message_starts_with_the_problem():
    # for callers that add their own prefix, e.g. "argument --advantage-estimator: "
    with pytest.raises(ValueError) as info:
        load_attribute("relax_no_such_module_xyz:Thing")
    assert str(info.value).startswith(
        "Cannot import module 'relax_no_such_module_xyz' (loading 'relax_no_such_module_xyz:Thing'): "
    )


def test_module_raising_on_import_is_reported_as_such(modules):
    spec = f"{modules['raises']}:score"
    with pytest.raises(ValueError) as info:
        load_attribute(spec, "--flag")
    assert str(info.value) == (
        f"--flag {spec!r}: importing module {modules['raises']!r} raised RuntimeError: boom at import"
    )
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_dependency_is_not_reported_as_the_module_missing(modules):
    spec = f"{modules['needs']}:score"
    with pytest.raises(ValueError) as info:
        load_attribute(spec, "--flag")
    msg = str(info.value)
    assert f"importing module {modules['needs']!r} raised ModuleNotFoundError" in msg
    assert "relax_no_such_dependency_xyz" in msg


def test_missing_attribute_lists_the_public_callables(modules):
    spec = f"{modules['good']}:scroe"
    with pytest.raises(ValueError) as info:
        load_attribute(spec, "--flag")
    assert str(info.value) == (
        f"--flag {spec!r}: module {modules['good']!r} has no attribute 'scroe'. "
        "Its public callables: Helper, score."
    )


def test_imports_only_the_standard_library():
    code = textwrap.dedent(
        """
        import json, sys
        before = set(sys.modules)
        import relax.importing
        print(json.dumps(sorted(set(sys.modules) - before)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    top = {m.split(".")[0] for m in loaded}
    assert top - {"relax"} <= set(sys.stdlib_module_names)
    assert [m for m in loaded if m.startswith("relax")] == ["relax", "relax.importing"]
