"""``--rollout-engine``: refused before anything starts where the engine does not fit the run (these
run without vLLM; the vLLM environment's own refusals are in tests/vllm_engine/test_vllm_refusals.py)."""

from __future__ import annotations

import pytest

from relax.rollout.vllm.factory import vllm_installed

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return build_tiny_random_checkpoint(tmp_path_factory.mktemp("engine_flag") / "qwen2", "qwen2")


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed in this environment")
def test_the_vllm_engine_without_the_extra_is_refused_with_the_install_line(cli, checkpoint):
    code, _, err = cli("train", "--hf-checkpoint", checkpoint, "--rollout-engine", "vllm", "--dry-run")
    assert code != 0
    assert "--rollout-engine vllm needs vLLM, which is not installed" in err
    assert "pip install -e '.[vllm]' torch==2.13.0" in err


def test_an_engine_that_does_not_fit_the_model_is_refused(cli, checkpoint):
    code, _, err = cli("train", "--rollout-engine", "hf", "--dry-run")
    assert code != 0 and "--rollout-engine hf generates from a Hugging Face model: give --hf-checkpoint" in err
    code, _, err = cli("train", "--hf-checkpoint", checkpoint, "--rollout-engine", "tiny", "--dry-run")
    assert code != 0 and "--rollout-engine tiny samples from the built-in model" in err
    code, _, err = cli("train", "--rollout-engine", "sglang", "--dry-run")
    assert code != 0 and "--rollout-engine" in err and "sglang" in err


def test_the_default_engine_follows_the_model(cli, checkpoint):
    for argv in ((), ("--rollout-engine", "tiny"), ("--hf-checkpoint", checkpoint, "--rollout-engine", "hf")):
        code, _, err = cli("train", *argv, "--dry-run")
        assert code == 0, err


def test_a_vllm_sampling_flag_with_another_engine_is_refused(cli, checkpoint):
    for flag, value in (("--rollout-top-k", "5"), ("--rollout-min-p", "0.1"), ("--rollout-stop", "\n")):
        code, _, err = cli("train", "--hf-checkpoint", checkpoint, flag, value, "--dry-run")
        assert code != 0 and "the hf engine would ignore it: add --rollout-engine vllm" in err, err
    # the tiny engine samples with top-k and min-p too (relax.models.sampled_distribution), not with stop strings
    code, _, err = cli("train", "--rollout-stop", "\n", "--dry-run")
    assert code != 0 and "--rollout-stop" in err and "the tiny engine would ignore it" in err, err
    for flag, value in (("--rollout-top-k", "5"), ("--rollout-min-p", "0.1")):
        code, _, err = cli("train", flag, value, "--dry-run")
        assert code == 0, err
