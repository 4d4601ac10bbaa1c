"""Pre-flight of an environment (``relax train --dry-run``: no Ray): built, reset on a real prompt,
stepped once; each problem is one error line naming the flag, environment, episode and turn."""

from __future__ import annotations

import textwrap

import pytest

ENVS = textwrap.dedent('''
    from relax.rollout import Environment, EnvStep

    class Fine(Environment):
        def step(self, completion):
            return EnvStep(done=True, rewards={"score": 1.0})

    class WrongType(Environment):
        def step(self, completion):
            return {"done": True}

    class Raises(Environment):
        def reset(self, sample):
            raise RuntimeError("no board for " + sample["prompt"])

        def step(self, completion):
            return EnvStep()

    class NotFinite(Environment):
        def step(self, completion):
            return EnvStep(done=True, rewards={"score": float("inf")})

    class NoStep:
        pass

    class Exits(Environment):
        def step(self, completion):
            raise SystemExit(3)

    def score(prompt, completion, label, metadata):
        return 1.0
''')


@pytest.fixture
def envs_module(tmp_path, monkeypatch):
    (tmp_path / "relax_preflight_envs.py").write_text(ENVS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "relax_preflight_envs"


def _dry_run(capsys, *flags) -> tuple[int, str]:
    from relax.cli.main import main

    try:
        code = main(["train", "--dry-run", "--output-dir", "out", *flags])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("cls, message", [
    ("WrongType", r"step\(\) returned dict; it must return relax.rollout.EnvStep"),
    ("Raises", r"episode 0 \(pre-flight, .*\): reset\(\) raised RuntimeError: no board for <bos>"),
    ("Exits", r"turn 1: step\(\) called sys.exit\(3\) \(SystemExit\), which would end the rollout worker's process"),
    ("NotFinite", r"returned reward 'score' = inf: not a finite number"),
    ("NoStep", r"--env-path 'relax_preflight_envs:NoStep': class NoStep has no step\(completion\) method"),
    ("Missing", r"--env-path 'relax_preflight_envs:Missing'.*has no attribute 'Missing'"),
])
def test_bad_environments_stop_before_anything_starts(envs_module, capsys, cls, message):
    import re

    code, err = _dry_run(capsys, "--env-path", f"{envs_module}:{cls}", "--reward-keys", "score")
    assert code == 2 and re.search(message, err), err


def test_a_good_environment_passes_and_a_reward_function_is_refused(envs_module, capsys):
    code, err = _dry_run(capsys, "--env-path", f"{envs_module}:Fine", "--reward-keys", "score")
    assert code == 0, err
    code, err = _dry_run(capsys, "--env-path", f"{envs_module}:Fine", "--reward-keys", "score",
                         "--custom-rm-path", f"{envs_module}:score")
    assert code == 2 and "has no effect with relax_preflight_envs:Fine" in err
