"""The asynchronous-training flags are checked before anything starts, from the class's capabilities."""

import textwrap

import pytest
import yaml


def _rejected(cli, *argv) -> str:
    code, out, err = cli("train", "--dry-run", *argv)
    assert code == 2, f"expected exit 2, got {code}; stderr: {err}"
    assert out == "" and "relax train: error:" in err
    return err


def test_a_method_that_needs_on_policy_samples_refuses_async(cli):
    err = _rejected(cli, "--advantage-estimator", "rloo", "--fully-async")
    assert "cannot learn from samples of an older policy (supports_async = False (requires_on_policy_updates = True))" in err
    assert "drop --fully-async" in err
    err = _rejected(cli, "--advantage-estimator", "rloo", "--off-policy-correction", "tis")
    assert "drop --off-policy-correction tis" in err


def test_a_users_class_that_forbids_async_is_refused(cli, tmp_path, monkeypatch):
    (tmp_path / "my_onpolicy.py").write_text(textwrap.dedent('''
        from relax.algorithms.grpo import GRPO

        class OnPolicyGRPO(GRPO):
            name = None
            supports_async = False
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _rejected(cli, "--advantage-estimator", "my_onpolicy:OnPolicyGRPO", "--fully-async")
    assert "supports_async = False" in err and "drop --fully-async" in err


def test_max_staleness_needs_fully_async(cli):
    err = _rejected(cli, "--max-staleness", "2")
    assert "--max-staleness 2 needs --fully-async" in err
    assert "must be >= 0" in _rejected(cli, "--fully-async", "--max-staleness", "-1")


def test_rollout_workers_must_divide_the_prompt_batch(cli):
    err = _rejected(cli, "--rollout-num-workers", "3", "--rollout-batch-size", "32")
    assert "--rollout-batch-size 32 must be a multiple of --rollout-num-workers 3" in err


@pytest.mark.parametrize("algo", ["gdpo", "grpo", "reinforce_plus_plus"])
def test_gdpo_and_batch_statistic_methods_run_async(cli, algo):
    extra = ["--normalize-advantages"] if algo == "reinforce_plus_plus" else []
    code, out, err = cli("train", "--dry-run", "--advantage-estimator", algo, "--fully-async",
                         "--off-policy-correction", "decoupled", *extra)
    assert code == 0, err
    effective = yaml.safe_load(out)
    assert effective["fully_async"] is True and effective["max_staleness"] is None
