"""PPO's critic on Hugging Face models: the value head on the decoder's last hidden state, trained
through the torch backend (``TorchBackend.for_critic``)."""

import attrs
import torch

from relax.algorithms import PolicyLossOutput, numerics
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.hf import load_hf_model
from relax.models.value import ValueModel, response_values
from relax.config.run import RunConfig


def _batch() -> TokenBatch:
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 40, (4, 3), generator=g)
    prompt_mask = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)
    response_ids = torch.randint(5, 40, (4, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask)


def test_value_head_reads_the_decoders_last_hidden_state(checkpoints, family):
    policy = load_hf_model(checkpoints[family])
    critic = ValueModel(policy)
    with torch.no_grad():
        critic.head.weight.copy_(torch.linspace(-1, 1, critic.head.weight.numel()).view_as(critic.head.weight))
        critic.head.bias.fill_(0.25)
    batch = _batch()
    values = response_values(critic, batch)
    # Independent reference: the transformers model's own hidden states, projected by hand.
    out = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                 position_ids=batch.position_ids, output_hidden_states=True, use_cache=False)
    full = out.hidden_states[-1] @ critic.head.weight[0] + 0.25
    p, t = batch.prompt_width, batch.response_ids.shape[1]
    expected = full[:, p - 1 : p + t - 1] * batch.response_mask
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
    assert (values[~batch.response_mask] == 0).all()


def test_hf_critic_trains_toward_the_returns(checkpoints):
    config = attrs.evolve(RunConfig(), hf_checkpoint=str(checkpoints["qwen2"]), critic_lr=1e-2)
    backend = TorchBackend.for_critic(config, ValueModel(load_hf_model(checkpoints["qwen2"])))
    batch = _batch()
    returns = torch.tensor([0.5, -1.0, 2.0, 1.0])[:, None].expand(4, 4) * batch.response_mask
    old = backend.compute_values(batch)
    assert (old == 0).all()  # zero-initialized head

    def loss_fn(out, micro):
        loss, clipfrac = numerics.value_loss(out.values, old[micro], returns[micro], batch.response_mask[micro],
                                             None, "token_mean")
        return PolicyLossOutput(loss=loss, metrics={"value_clipfrac": clipfrac})

    losses = [backend.train_step(batch, loss_fn, with_entropy=False)["loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0], losses
