"""``--sharding fsdp`` on two gloo ranks: the sharded torch backend gives the replicated path's numbers.

One spawn of two ranks runs every check of ``_sharding_dist_checks`` (the replicated ``TorchBackend``
with its gradient all-reduce and the FSDP2 ``ShardedTorchBackend`` side by side, on uneven shards);
the tests compare what the ranks report. A hang fails through the join timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sharding_dist_checks as checks  # noqa: E402  (spawned children import it by this name)

from relax.backends import sharding  # noqa: E402
from spawned_ranks import spawn_ranks  # noqa: E402

GLOO_TIMEOUT_S = 60
JOIN_TIMEOUT_S = 200


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    hf_dir = build_tiny_random_checkpoint(tmp_path_factory.mktemp("hf"), "qwen3", tie=True, hidden=32, layers=2)
    out, _ = spawn_ranks(checks.run_rank, checks.WORLD, GLOO_TIMEOUT_S, str(hf_dir), join_timeout_s=JOIN_TIMEOUT_S)
    return out


def _same_training(res, rtol):
    for replicated, sharded in res["loss"] + res["grad_norm"]:
        assert sharded == pytest.approx(replicated, rel=rtol, abs=1e-9)
    assert res["moved"] > 1e-2  # the steps changed the weights: the comparison is not of untouched models


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_steps_give_the_replicated_losses_gradients_and_weights(results, rank):
    res = results[rank]["fp32"]
    assert res["old_log_probs"] <= 1e-6
    _same_training(res, 1e-6)
    assert res["grads"] <= 1e-6, res
    # Adam divides each gradient by its own magnitude: where a gradient is ~0, float32 rounding of the
    # sum decides the direction of a step of up to lr, so the weights agree as a whole (relative to how
    # far the steps moved them), not element by element
    assert res["weights"] <= 1e-3, res


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_packed_micro_batches_give_the_replicated_numbers(results, rank):
    res = results[rank]["packed"]
    _same_training(res, 1e-6)
    assert res["grads"] <= 1e-6 and res["weights"] <= 1e-3, res


@pytest.mark.timeout(240)
def test_sharded_bf16_is_close_to_the_replicated_bf16(results):
    # bfloat16 parameters (mixed-precision policy) vs autocast over float32: the same compute dtype, other
    # rounding points, so only bfloat16-close
    res = results[0]["bf16"]
    for replicated, sharded in res["loss"] + res["grad_norm"]:
        assert sharded == pytest.approx(replicated, rel=3e-2)
    assert res["grads_whole"] <= 5e-2, res  # the whole gradient's relative difference


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_checkpoint_resumes_exactly_with_any_number_of_ranks(results, rank):
    res = results[rank]["checkpoint"]
    assert res["state_is_the_weights"] and res["one_rank_resumes"], res
    a, b = res["resumed_loss"]
    assert a == b
    assert res["resumed_weights_equal"] and res["exported_keys"] and res["step"] == 3  # two steps, saved, one more


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_reference_gives_the_reference_pass(results, rank):
    res = results[rank]["reference"]
    assert res["padded"] <= 1e-6 and res["packed"] <= 1e-6 and res["empty_rank"] == 0.0, res


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_transformers_model_with_recompute_and_its_hf_export(results, rank):
    res = results[rank]["hf"]
    assert res["old_log_probs"] <= 1e-6
    for replicated, sharded in res["loss"] + res["grad_norm"]:
        assert sharded == pytest.approx(replicated, rel=1e-6, abs=1e-9)
    assert res["grads"] <= 1e-6 and res["hf_loads"], res


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", range(checks.WORLD))
def test_sharded_lora_gives_the_replicated_steps_payload_and_resumes_exactly(results, rank):
    res = results[rank]["lora"]
    for replicated, sharded in res["loss"] + res["grad_norm"]:
        assert sharded == pytest.approx(replicated, rel=1e-6, abs=1e-9)
    a, b = res["resumed_loss"]
    assert a == b and res["same_keys"], res
    assert res["payload"] <= 1e-3, res  # two Adam steps on the adapters (see the weights comparison above)


def test_decoder_layers_are_found_for_the_builtin_and_transformers_models():
    from torch import nn

    from relax.models.hf.tiny_random import model_config
    from relax.models.tiny.weights import load_warmup_model

    tiny = load_warmup_model(None)
    assert sharding.decoder_layers(tiny) is tiny.blocks
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(model_config("qwen3", 64, hidden=32, layers=2))
    assert sharding.decoder_layers(hf) is hf.model.layers
    assert sharding.decoder_layers(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) is None
