"""No module under relax/ is over 400 lines: a longer one holds more than one job, and is split by
what its parts do (small modules with one job each)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "relax"
MAX_LINES = 400


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def oversized_modules(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``"relax/x.py: N lines"`` for every ``*.py`` under ``root`` longer than ``limit`` lines."""
    return [
        f"{path.relative_to(root.parent)}: {n} lines"
        for path in sorted(root.rglob("*.py"))
        if (n := _line_count(path)) > limit
    ]


def test_no_module_is_over_400_lines():
    too_long = oversized_modules(ROOT)
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split each by what its parts do):\n" + "\n".join(too_long)
    )


def test_the_check_names_the_file_and_its_length(tmp_path):
    package = tmp_path / "relax"
    (package / "sub").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized_modules(package) == ["relax/sub/long.py: 401 lines"]
