"""``--max-tokens-per-micro-batch`` for the forward-only passes outside the policy backend: the reference
model's log-probs run in the policy's packed micro-batches, the critic's values in padded micro-batches
of at most the budget's tokens. Each gives the padded pass's numbers to float rounding, and no forward
holds more than the budget (a sample longer than it aside); without the flag nothing changes."""

from __future__ import annotations

import pytest
import torch
from test_packing import BUDGET, MODELS, make_batch, tiny_model

from relax.algorithms import numerics
from relax.backends.token_budget import padded_rows_within
from relax.backends.torch_backend import TorchBackend
from relax.config.run import RunConfig
from relax.models.batch import response_log_probs
from relax.models.value import ValueModel, response_values
from relax.runtime.step.reference_pass import reference_log_probs

TEMPERATURE = 0.8  # not 1: the packed pass must divide the logits like the padded one


def first_layer(model):
    return model.blocks[0] if hasattr(model, "blocks") else model.model.layers[0]


def forward_shapes(model, fn):
    """``fn()``'s result and the ``[rows, width]`` of every forward through the model's first layer."""
    shapes = []

    def record(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        shapes.append(tuple(hidden.shape[:2]))

    handle = first_layer(model).register_forward_pre_hook(record, with_kwargs=True)
    try:
        return fn(), shapes
    finally:
        handle.remove()


@pytest.mark.parametrize("family", sorted(MODELS))
def test_packed_reference_log_probs_and_kl_equal_the_padded_pass(family):
    model, batch = MODELS[family]().eval(), make_batch()  # prompts of 1..5, responses of 1..9 tokens
    padded, padded_shapes = forward_shapes(model, lambda: reference_log_probs(
        model, batch, RunConfig(micro_batch_size=4, rollout_temperature=TEMPERATURE)))
    packed, packed_shapes = forward_shapes(model, lambda: reference_log_probs(
        model, batch, RunConfig(max_tokens_per_micro_batch=BUDGET, rollout_temperature=TEMPERATURE)))
    assert padded_shapes == [(4, batch.input_ids.shape[1])] * 3
    # packed: one row per micro-batch, each within the budget, all real tokens and no padding
    real = batch.attention_mask.sum(1)
    assert len(packed_shapes) == 5 and all(rows == 1 and width <= BUDGET for rows, width in packed_shapes)
    assert sum(width for _, width in packed_shapes) == int(real.sum()) < batch.input_ids.numel()
    assert (padded != 0).sum() > 50 and torch.equal(packed != 0, padded != 0)
    torch.testing.assert_close(packed, padded, rtol=0, atol=2e-5)
    # the KL to the reference the loss and the rewards read, against a policy that differs from it
    old = TorchBackend(tiny_model(seed=3) if family == "tiny" else MODELS[family](seed=3),
                       temperature=TEMPERATURE).compute_log_probs(batch).log_probs
    for estimator in ("k1", "low_var_kl"):
        kl_padded = numerics.kl_estimate(old, padded, estimator) * batch.response_mask
        kl_packed = numerics.kl_estimate(old, packed, estimator) * batch.response_mask
        assert float(kl_padded.abs().max()) > 1e-2  # the two policies differ: the KL is not trivially 0
        torch.testing.assert_close(kl_packed, kl_padded, rtol=0, atol=5e-5)


@pytest.mark.parametrize("micro_batch_size", [None, 5])
def test_without_the_flag_the_reference_pass_is_the_padded_loop(micro_batch_size):
    """Bit for bit the loop of ``--micro-batch-size`` rows (the whole shard without it)."""
    model, batch = tiny_model().eval(), make_batch()
    config = RunConfig(micro_batch_size=micro_batch_size, rollout_temperature=TEMPERATURE)
    out, shapes = forward_shapes(model, lambda: reference_log_probs(model, batch, config))
    size = micro_batch_size or len(batch)
    expected = []
    with torch.no_grad():
        for start in range(0, len(batch), size):
            sub = batch.select(slice(start, start + size))
            logits = model(input_ids=sub.input_ids, attention_mask=sub.attention_mask.long(),
                           position_ids=sub.position_ids)
            expected.append(response_log_probs(logits, sub, with_entropy=False, temperature=TEMPERATURE).log_probs)
    assert torch.equal(out, torch.cat(expected))
    assert [rows for rows, _ in shapes] == [size] * (len(batch) // size) + ([len(batch) % size] if len(batch) % size else [])


def test_critic_values_within_the_budget_equal_the_whole_step():
    batch = make_batch()  # 12 rows of width 5 + 9
    width = batch.input_ids.shape[1]
    assert padded_rows_within(None, batch) is None  # no flag: the whole step, as before
    assert padded_rows_within(3 * width + 1, batch) == 3 and padded_rows_within(width - 1, batch) == 1
    value_model = ValueModel(tiny_model())
    with torch.no_grad():  # the head starts at zero: give it weights, so the values are not all 0
        value_model.head.weight.normal_(0.0, 0.5)
        value_model.head.bias.fill_(0.1)
    backend = TorchBackend(value_model, value_head=True)
    whole, whole_shapes = forward_shapes(value_model.trunk, lambda: backend.compute_values(batch))
    budget = 30
    within, shapes = forward_shapes(value_model.trunk, lambda: backend.compute_values(
        batch, micro_batch_size=padded_rows_within(budget, batch)))
    assert whole_shapes == [(12, width)]
    assert shapes == [(2, width)] * 6 and all(rows * w <= budget for rows, w in shapes)
    with torch.no_grad():  # an independent reference: each sample alone
        alone = torch.cat([response_values(value_model, batch.select(slice(i, i + 1))) for i in range(len(batch))])
    assert (alone != 0).sum() > 50
    torch.testing.assert_close(within, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(whole, alone, rtol=0, atol=1e-5)
