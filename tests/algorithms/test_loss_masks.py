"""Multi-turn loss masks: environment tokens sit inside the response (attended to) but the loss mask
(``response_mask``) is False there, so they get no gradient and count in no denominator, KL,
entropy or off-policy weight. Layout used throughout: one episode ``m1 m2 <obs> m3`` (two model
tokens, one environment token, one model token) next to a plain single-turn row."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.algorithms.numerics import aggregate
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

# Row 0: m1 m2 <obs> m3; row 1: three model tokens and one pad.
LOSS_MASK = torch.tensor([[True, True, False, True], [True, True, True, False]])
ATTENDED = torch.tensor([[True, True, True, True], [True, True, True, False]])
OBS = (0, 2)

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def _inputs(log_probs, **extra):
    g = torch.Generator().manual_seed(0)
    shape = LOSS_MASK.shape
    return PolicyLossInputs(
        log_probs=log_probs,
        # within the clip range, so that every model token keeps a gradient
        old_log_probs=log_probs.detach() + 0.1 * (torch.rand(shape, generator=g) - 0.5),
        advantages=torch.tensor([[0.7, 0.7, 0.7, 0.7], [-1.3, -1.3, -1.3, -1.3]]),
        response_mask=LOSS_MASK,
        ref_log_probs=-torch.rand(shape, generator=g) - 0.2,
        entropy=torch.rand(shape, generator=g) + 0.5,
        rollout_log_probs=-torch.rand(shape, generator=g) - 0.1,
        **extra,
    )


def _grpo(**kw):
    return get_algorithm("grpo")(AlgorithmConfig(**kw))


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("extras", [{}, {"use_kl_loss": True, "kl_loss_coef": 0.3, "entropy_coef": 0.01},
                                    {"off_policy_correction": "tis"}])
def test_observation_log_prob_gets_exactly_zero_gradient(aggregation, extras):
    algorithm = _grpo(loss_aggregation=aggregation, **extras)
    log_probs = (-torch.rand(LOSS_MASK.shape, generator=torch.Generator().manual_seed(1)) - 0.1).requires_grad_()
    out = algorithm.policy_loss(_inputs(log_probs))
    out.loss.backward()
    assert log_probs.grad[OBS].item() == 0.0
    # every model token does get a gradient (the test would pass vacuously otherwise)
    assert bool((log_probs.grad[LOSS_MASK] != 0).all())


def _drop_observation(t: torch.Tensor) -> torch.Tensor:
    """Row 0 without its observation column, right-padded: ``m1 m2 m3 <pad>``."""
    out = t.clone()
    out[0, 2], out[0, 3] = t[0, 3], 0
    return out


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_same_loss_with_and_without_observation_tokens(aggregation):
    """The model tokens and their numbers are the same; the observation column holds garbage."""
    algorithm = _grpo(loss_aggregation=aggregation, use_kl_loss=True, kl_loss_coef=0.2, entropy_coef=0.05,
                      off_policy_correction="tis")
    with_obs = _inputs(-torch.rand(LOSS_MASK.shape, generator=torch.Generator().manual_seed(2)) - 0.1)
    fields = ("log_probs", "old_log_probs", "advantages", "ref_log_probs", "entropy", "rollout_log_probs")
    garbage = {name: getattr(with_obs, name).clone() for name in fields}
    for t in garbage.values():
        t[OBS] = 123.0  # anything: it must not matter
    with_obs = PolicyLossInputs(response_mask=LOSS_MASK, **garbage)
    without = PolicyLossInputs(response_mask=_drop_observation(LOSS_MASK),
                               **{name: _drop_observation(t) for name, t in garbage.items()})
    a, b = algorithm.policy_loss(with_obs), algorithm.policy_loss(without)
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=1e-7)
    for key in ("pg_loss", "kl_loss", "entropy", "off_policy_weight"):
        torch.testing.assert_close(a.metrics[key], b.metrics[key], rtol=0, atol=1e-7)


def test_token_mean_denominator_counts_model_tokens_only():
    per_token = torch.tensor([[1.0, 2.0, 100.0, 4.0], [3.0, 5.0, 7.0, 0.0]])
    # (1 + 2 + 4 + 3 + 5 + 7) / 6 model tokens: the observation's 100 and the pad are out
    assert aggregate(per_token, LOSS_MASK, "token_mean").item() == pytest.approx(22 / 6, abs=1e-7)
    # per sequence: row 0 over its 3 model tokens
    assert aggregate(per_token, LOSS_MASK, "seq_mean_token_mean").item() == pytest.approx((7 / 3 + 15 / 3) / 2)
    assert aggregate(per_token, LOSS_MASK, "seq_mean_token_sum").item() == pytest.approx((7 + 15) / 2)


def test_batch_keeps_loss_and_attention_masks_apart():
    batch = TokenBatch(prompt_ids=torch.ones((2, 2), dtype=torch.long), prompt_mask=torch.tensor([[False, True]] * 2),
                       response_ids=torch.ones((2, 4), dtype=torch.long), response_mask=LOSS_MASK,
                       response_attention_mask=ATTENDED)
    assert batch.attention_mask.tolist()[0] == [False, True, True, True, True, True]
    # positions run through the observation: m3 is at position 4 (prompt 0, m1 1, m2 2, obs 3)
    assert batch.position_ids.tolist()[0] == [0, 0, 1, 2, 3, 4]
    assert batch.select([0]).response_attention_mask.tolist() == [ATTENDED[0].tolist()]
    with pytest.raises(ValueError, match="loss mask"):
        TokenBatch(prompt_ids=batch.prompt_ids, prompt_mask=batch.prompt_mask, response_ids=batch.response_ids,
                   response_mask=ATTENDED, response_attention_mask=LOSS_MASK)


def _tiny():
    torch.manual_seed(0)
    return TinyCausalLM(TinyLMConfig(vocab_size=17, max_seq_len=16))


def test_backend_attends_to_observation_but_gives_it_no_log_prob():
    """The trainer's forward: m3's log-prob equals that of a single-turn row whose prompt already
    holds ``m1 m2 <obs>`` (the observation is attended to, at the right position), and the
    observation's own log-prob and entropy are zero."""
    backend = TorchBackend(_tiny())
    prompt, m1, m2, obs, m3 = [1, 5], 3, 4, 9, 16
    episode = TokenBatch(
        prompt_ids=torch.tensor([prompt]), prompt_mask=torch.ones((1, 2), dtype=torch.bool),
        response_ids=torch.tensor([[m1, m2, obs, m3]]), response_mask=LOSS_MASK[:1],
        response_attention_mask=ATTENDED[:1])
    reference = TokenBatch(
        prompt_ids=torch.tensor([prompt + [m1, m2, obs]]), prompt_mask=torch.ones((1, 5), dtype=torch.bool),
        response_ids=torch.tensor([[m3]]), response_mask=torch.ones((1, 1), dtype=torch.bool))
    got = backend.compute_log_probs(episode, with_entropy=True)
    want = backend.compute_log_probs(reference, with_entropy=True)
    assert got.log_probs[0, 2].item() == 0.0 and got.entropy[0, 2].item() == 0.0
    torch.testing.assert_close(got.log_probs[0, 3], want.log_probs[0, 0], rtol=0, atol=1e-5)
    # without the attention mask the observation would be padding and m3's log-prob would differ
    hidden = TokenBatch(prompt_ids=episode.prompt_ids, prompt_mask=episode.prompt_mask,
                        response_ids=episode.response_ids, response_mask=LOSS_MASK[:1])
    assert abs(backend.compute_log_probs(hidden).log_probs[0, 3].item() - want.log_probs[0, 0].item()) > 1e-4


def test_backend_step_gives_no_gradient_through_observation_embedding_alone():
    """A train step on the episode changes the weights exactly as one on the reference layout does
    when only m3 carries advantage: the observation contributes context, never a loss term."""
    from relax.runtime.step.losses import policy_loss_fn

    algorithm = _grpo()
    prompt, m1, m2, obs, m3 = [1, 5], 3, 4, 9, 16
    episode = TokenBatch(
        prompt_ids=torch.tensor([prompt]), prompt_mask=torch.ones((1, 2), dtype=torch.bool),
        response_ids=torch.tensor([[m1, m2, obs, m3]]), response_mask=torch.tensor([[False, False, False, True]]),
        response_attention_mask=ATTENDED[:1])
    reference = TokenBatch(
        prompt_ids=torch.tensor([prompt + [m1, m2, obs]]), prompt_mask=torch.ones((1, 5), dtype=torch.bool),
        response_ids=torch.tensor([[m3]]), response_mask=torch.ones((1, 1), dtype=torch.bool))
    grads = []
    for batch in (episode, reference):
        backend = TorchBackend(_tiny(), lr=1e-2)
        old = backend.compute_log_probs(batch).log_probs
        adv = torch.full(old.shape, 0.5) * batch.response_mask
        fn = policy_loss_fn(algorithm, old_log_probs=old, advantages=adv, response_mask=batch.response_mask,
                            global_num_tokens=1.0, global_num_sequences=1.0)
        backend.train_step(batch, fn)
        grads.append({k: v.clone() for k, v in backend.model.state_dict().items()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=0, atol=1e-6, msg=name)
