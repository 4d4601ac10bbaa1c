"""docs/design.md names every member of the ``TrainingBackend`` contract and of the rollout engine entry."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from relax.backends.base import TrainingBackend

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def _backend_section() -> str:
    text = DESIGN.read_text()
    start = text.index("### Add a training backend")
    return text[start : text.index("\n### ", start + 1)]


def _contract_members() -> set[str]:
    """Every public method and class-level fact the class declares (not inherited from ``object``)."""
    own = {name for name, _ in inspect.getmembers(TrainingBackend) if not name.startswith("_")}
    return own - set(dir(object))


def test_design_names_every_member_of_the_backend_contract():
    named = set(re.findall(r"`([a-z_]+)`", _backend_section()))
    missing = sorted(_contract_members() - named)
    assert not missing, f"docs/design.md 'Add a training backend' does not name: {missing}"


def test_every_member_the_design_lists_exists_on_the_class():
    section = _backend_section()
    listed = set(re.findall(r"`([a-z_]+)`", section.split("List its entry")[0]))
    unknown = sorted(name for name in listed if not hasattr(TrainingBackend, name))
    assert not unknown, f"docs/design.md names backend members the class does not have: {unknown}"


def test_design_names_every_member_of_the_engine_entry():
    """The rollout engine's registry entry (``relax.rollout.registry.EngineEntry``), likewise."""
    from relax.rollout.registry import EngineEntry

    text = DESIGN.read_text()
    start = text.index("### Add a rollout engine")
    named = set(re.findall(r"`([a-z_]+)`", text[start : text.index("\n### ", start + 1)]))
    members = {name for name, _ in inspect.getmembers(EngineEntry) if not name.startswith("_")}
    members -= set(dir(object))
    missing = sorted(members - named)
    assert not missing, f"docs/design.md 'Add a rollout engine' does not name: {missing}"
