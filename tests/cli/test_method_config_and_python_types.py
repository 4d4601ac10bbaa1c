"""A method's ``Config`` that clashes with a shared flag or lacks a default is refused when the class is
defined (naming class and field), through ``relax train --dry-run`` too; ``run(RunConfig(...))`` checks
value types like the command line before anything starts."""

from __future__ import annotations

import textwrap

import attrs
import pytest

from relax.algorithms.grpo import GRPO
from relax.config.fields import flag
from relax.config.run import RunConfig


def test_a_field_named_like_a_shared_flag_is_refused_at_class_definition():
    with pytest.raises(TypeError, match=r"Clash\.Config\.lr has the name of relax train's shared flag --lr"):
        class Clash(GRPO):  # noqa: F841 - defining it is the test
            name = "clash"

            @attrs.frozen(kw_only=True)
            class Config(GRPO.Config):
                lr: float = attrs.field(default=0.1, metadata=flag("my lr", group="algorithm"))


def test_a_field_without_a_default_is_refused_at_class_definition():
    with pytest.raises(TypeError, match=r"NoDefault\.Config\.alpha has no default; .*\(--alpha\)"):
        class NoDefault(GRPO):  # noqa: F841
            name = "nodefault"

            @attrs.frozen(kw_only=True)
            class Config(GRPO.Config):
                alpha: float = attrs.field(metadata=flag("my alpha", group="algorithm"))


def test_a_good_added_field_still_passes():
    class Fine(GRPO):
        name = "fine"

        @attrs.frozen(kw_only=True)
        class Config(GRPO.Config):
            alpha: float = attrs.field(default=0.5, metadata=flag("my alpha", group="algorithm"))

    assert Fine.Config().alpha == 0.5


def test_the_dry_run_names_class_and_field(tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    (tmp_path / "clash_method.py").write_text(textwrap.dedent('''
        import attrs
        from relax.algorithms.grpo import GRPO
        from relax.config.fields import flag

        class Clash(GRPO):
            name = "clash"

            @attrs.frozen(kw_only=True)
            class Config(GRPO.Config):
                seed: int = attrs.field(default=1, metadata=flag("my seed", group="algorithm"))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dry-run", "--advantage-estimator", "clash_method:Clash", "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("relax train: error:") == 1 and "Traceback" not in err, err
    assert "Clash.Config.seed has the name of relax train's shared flag --seed" in err


def test_run_checks_python_values_like_the_command_line(tmp_path):
    from relax.runtime.checks.validation import ConfigError
    from relax.runtime.driver.train import run

    with pytest.raises(ConfigError) as caught:
        run(RunConfig(lr="0.001", in_process=True, num_rollout=1, output_dir=str(tmp_path / "o")))
    assert caught.value.errors == ["argument --lr: '0.001' is a str (in Python, pass the value itself); "
                                   "it must be finite and > 0"]
    assert not (tmp_path / "o").exists()
