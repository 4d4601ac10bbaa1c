"""Fixtures for the command-line tests: run ``relax`` in-process, and user algorithm classes.

The user classes live in a module written to a temporary directory and are loaded through
``--advantage-estimator module:Class``, exactly as a user's own method would be.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from relax.algorithms.base import AlgorithmMeta
from relax.cli.main import main

USER_MODULE = "relax_cli_test_user_algos"

USER_SOURCE = textwrap.dedent(
    '''
    """User algorithms for tests/cli: each declares one capability (stages are never called)."""
    import torch

    from relax.algorithms import BUILTIN_ALGORITHMS, RLAlgorithm


    class _Base(RLAlgorithm):
        def normalize_rewards(self, rewards, group_ids):
            return rewards.float()

        def compute_advantages(self, inputs, process_group=None):
            raise NotImplementedError

        def policy_loss(self, inputs):
            raise NotImplementedError


    class Plain(_Base):
        """A method that declares nothing."""


    class NeedsNorm(_Base):
        advantage_normalization = "required"


    class ForbidsNorm(_Base):
        advantage_normalization = "forbidden"


    class MinGroup4(_Base):
        min_group_size = 4


    class GroupRelative(_Base):
        group_relative = True


    class MultiReward(_Base):
        """Normalizes reward components separately."""
        uses_reward_components = True
        min_group_size = 2
        hyperparameters = ("reward_keys", "reward_weights")


    class NeedsRewardNorm(_Base):
        requires_rewards_normalization = True


    class NoHooks(_Base):
        allows_reward_post_process_hooks = False


    class NoRewardKL(_Base):
        forbids_reward_side_kl = True


    class TokenLoss(_Base):
        requires_global_token_loss = True


    class OnPolicy(_Base):
        requires_on_policy_updates = True
        supports_async = False


    # A user copy of every built-in class: same capabilities (and declared hyper-parameters, with the
    # Config that holds them), defined outside relax.
    COPIES = {}
    for _builtin in BUILTIN_ALGORITHMS:
        COPIES[_builtin.name] = type(
            "Copy" + _builtin.__name__,
            (_Base,),
            dict(_builtin.capabilities(), hyperparameters=_builtin.hyperparameters, Config=_builtin.Config,
                 __module__=__name__),
        )
        globals()["Copy" + _builtin.__name__] = COPIES[_builtin.name]


    def hook(*args, **kwargs):
        """A reward post-process hook / filter stand-in."""
        return None
    '''
)


@pytest.fixture(scope="session")
def user_module(tmp_path_factory):
    """The module name of the user algorithms; it is importable for the whole session."""
    directory = tmp_path_factory.mktemp("user_algos")
    (directory / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    sys.path.insert(0, str(directory))
    yield USER_MODULE
    # leave the record of defined classes as other test modules expect it (relax's own classes)
    AlgorithmMeta.defined[:] = [c for c in AlgorithmMeta.defined if c.__module__ != USER_MODULE]
    sys.path.remove(str(directory))
    sys.modules.pop(USER_MODULE, None)


TASK_KEYS = ("correct", "format")


REAL_PREFLIGHT = "real_preflight"  # a module marked so tests pre-flight with the real built-in task


def _real_preflight(request) -> bool:
    return request.node.get_closest_marker(REAL_PREFLIGHT) is not None


@pytest.fixture(autouse=True)
def fixed_task_keys(monkeypatch, request):
    """The built-in task's reward keys, fixed so these tests do not depend on the task module
    (except under ``pytest.mark.real_preflight``: the real task, its reward function called)."""
    if not _real_preflight(request):
        monkeypatch.setattr("relax.cli.build.default_reward_keys", lambda task: TASK_KEYS)


@pytest.fixture(autouse=True)
def preflight_off(monkeypatch, request):
    """These tests exercise parsing and validation on configurations whose data, reward function
    and output directory are not real; pre-flight (relax.runtime.preflight) has its own tests
    (the modules marked ``pytest.mark.real_preflight``, e.g. tests/cli/test_bad_inputs.py). Off for
    ``relax train`` and for ``run(config)`` (which runs it on a configuration ``relax train`` has
    not checked)."""
    if _real_preflight(request):
        return
    monkeypatch.setattr("relax.cli.main.preflight", lambda config, algorithm: [])
    monkeypatch.setattr("relax.runtime.driver.train.preflight_once", lambda config, algorithm: [])


@pytest.fixture
def cli(capsys):
    """Run ``relax ARGV`` in-process; returns (exit code, stdout, stderr)."""

    def run(*argv):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
