"""``relax algorithms``: the table, ``--json`` and one method's details."""

from __future__ import annotations

import inspect
import json
import sys

from relax.algorithms import BUILTIN_ALGORITHMS, CAPABILITIES, algorithm_names, get_algorithm
from relax.cli.algorithms_cmd import COLUMN_LABELS


def test_table_lists_every_method_with_its_capabilities(cli):
    code, out, _ = cli("algorithms")
    assert code == 0
    lines = out.splitlines()
    header = lines[0].split()
    assert header == ["name", *(COLUMN_LABELS[c] for c in CAPABILITIES)]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2 : 2 + len(BUILTIN_ALGORITHMS)]}
    assert list(rows) == list(algorithm_names())
    for cls in BUILTIN_ALGORITHMS:
        shown = dict(zip(CAPABILITIES, rows[cls.name]))
        for cap, value in cls.capabilities().items():
            expected = ("yes" if value else "-") if isinstance(value, bool) else str(value)
            assert shown[cap] == expected, (cls.name, cap)
    for cap in CAPABILITIES:  # legend
        assert f"{cap}: {CAPABILITIES[cap].doc}" in out


def test_json(cli):
    code, out, _ = cli("algorithms", "--json")
    assert code == 0
    data = json.loads(out)
    assert [d["name"] for d in data] == list(algorithm_names())
    for entry, cls in zip(data, BUILTIN_ALGORITHMS):
        assert entry["capabilities"] == cls.capabilities()
        assert list(entry["hyperparameters"]) == list(cls.hyperparameters)
        assert entry["class"] == f"{cls.__module__}.{cls.__qualname__}"


def test_one_method_shows_doc_capabilities_and_flags(cli):
    cls = get_algorithm("gdpo")
    code, out, _ = cli("algorithms", "gdpo")
    assert code == 0
    doc = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__  # its own, not GRPO's
    assert inspect.cleandoc(doc).splitlines()[0] in out
    if cls.__doc__ is None:
        assert inspect.getdoc(cls.__mro__[1]).splitlines()[0] not in out
    assert "uses_reward_components = True" in out
    flags = {"reward_keys": "--reward-keys", "reward_weights": "--reward-weights", "lam": "--lambd"}
    for field in cls.hyperparameters:
        assert flags.get(field, "--" + field.replace("_", "-")) in out, field


def test_user_method_by_path_and_json(cli, user_module):
    code, out, _ = cli("algorithms", f"{user_module}:MultiReward")
    assert code == 0
    assert "Normalizes reward components separately." in out
    assert "--reward-keys, --gdpo-reward-keys" in out
    code, out, _ = cli("algorithms", f"{user_module}:MultiReward", "--json")
    assert json.loads(out)["capabilities"]["uses_reward_components"] is True


def test_unknown_method(cli):
    code, out, err = cli("algorithms", "nope")
    assert code == 2 and out == ""
    assert "Unknown advantage estimator 'nope'. Available: " + ", ".join(algorithm_names()) in err


def test_a_user_subclass_without_a_name_is_titled_by_its_path_not_its_parents_name(cli, tmp_path, monkeypatch):
    (tmp_path / "scaled_user_method.py").write_text(
        "from relax.algorithms.grpo import GRPO\n\nclass ScaledGRPO(GRPO):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = cli("algorithms", "scaled_user_method:ScaledGRPO")
    assert code == 0
    assert out.splitlines()[0].startswith("scaled_user_method:ScaledGRPO ")  # was "grpo"
