"""Flags accepted in a combination where they do nothing warn (``relax train --dry-run``, before Ray):
``--max-turns`` without an environment, a task's environment dropped by ``--prompt-data``,
``--ray-working-dir`` with ``--in-process``."""

from __future__ import annotations

import pytest


def _warnings(cli, tmp_path, *argv) -> list[str]:
    code, _, err = cli("train", "--dry-run", "--output-dir", tmp_path / "out", *argv)
    assert code == 0, err
    return [line for line in err.splitlines() if line.startswith("relax train: warning:")]


@pytest.mark.parametrize("argv, message", [
    (["--max-turns", "3"], "--max-turns 3 has no effect without an environment: every sample is one model turn"),
    (["--in-process", "--ray-working-dir", "."],
     "--ray-working-dir . has no effect with --in-process: the roles run in this process"),
], ids=["max_turns_without_env", "ray_working_dir_in_process"])
def test_a_flag_without_effect_warns(cli, tmp_path, argv, message):
    assert any(message in line for line in _warnings(cli, tmp_path, *argv))


def test_a_tasks_environment_dropped_by_prompt_data_warns(cli, tmp_path, monkeypatch):
    (tmp_path / "calc_prompts.jsonl").write_text('{"prompt": "1+2=", "label": 3}\n')
    (tmp_path / "unused_flag_reward.py").write_text("def reward(prompt, completion, label, metadata):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    warned = _warnings(cli, tmp_path, "--task", "calculator", "--prompt-data", tmp_path / "calc_prompts.jsonl",
                       "--custom-rm-path", "unused_flag_reward:reward")
    assert any("--task calculator brings an environment, which is not used with --prompt-data" in w
               for w in warned), warned


def test_the_same_flags_where_they_act_do_not_warn(cli, tmp_path):
    assert not any("--max-turns" in w for w in _warnings(cli, tmp_path, "--task", "calculator", "--max-turns", "3"))
