"""Every install line in the README, the docs and the examples works from a checkout: ``pip install
-e '.[extra]' torch==2.13.0`` (the torch pin keeps pip from pulling a multi-GB CUDA build) or, on a GPU
machine that has its own CUDA torch, the project's declared torch range (which that torch satisfies, so
pip replaces nothing), and every extra it names exists in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])
TORCH_RANGE = next(d for d in PROJECT["dependencies"] if d.startswith("torch"))
# `pip install` followed by its arguments, up to the end of the inline code span or of the line
INSTALL = re.compile(r"pip install ([^`\n#]*)")
RELAX = re.compile(r"^-e (?:\.|'\.\[(?P<extras>[\w,-]+)\]')(?P<rest>.*)$")


def install_lines():
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in INSTALL.finditer(line):
                yield f"{page.relative_to(REPO)}:{number}", match[1].strip()


def test_relax_is_installed_editable_with_the_torch_pin_and_real_extras():
    problems = []
    for where, args in install_lines():
        if "relax-rl" in args:
            problems.append(f"{where}: `pip install {args}` (not published: install the checkout with -e)")
            continue
        relax = RELAX.match(args)
        if relax is None:
            continue  # another package (e.g. the vllm GPU build's own instructions)
        extras = set((relax["extras"] or "").split(",")) - {""}
        if extras - EXTRAS:
            problems.append(f"{where}: unknown extra(s) {sorted(extras - EXTRAS)}")
        if "torch==2.13.0" not in relax["rest"] and f"'{TORCH_RANGE}'" not in relax["rest"]:
            problems.append(f"{where}: `pip install {args}` without torch==2.13.0 (or '{TORCH_RANGE}' on a GPU)")
    assert problems == []


def test_the_install_lines_are_found():
    found = dict(install_lines())
    assert any(args.startswith("-e '.[plot]' torch==2.13.0") for args in found.values())  # the quick start
    assert sum(args.startswith("-e '.[") for args in found.values()) >= 5


def test_real_models_says_to_install_the_hf_extra():
    for lang in ("en", "zh"):
        assert "pip install -e '.[hf]' torch==2.13.0" in (REPO / "docs" / lang / "real-models.md").read_text()


def test_torch_is_a_range_that_holds_the_cpu_pin_and_the_gpu_images_torch():
    from packaging.specifiers import SpecifierSet

    allowed = SpecifierSet(TORCH_RANGE.removeprefix("torch"))
    assert "2.13.0" in allowed and "2.11.0" in allowed  # this machine's CPU build; the H200 image's CUDA build
    for lang in ("en", "zh"):
        assert f"pip install -e '.[hf]' '{TORCH_RANGE}'" in (REPO / "docs" / lang / "gpu.md").read_text()
