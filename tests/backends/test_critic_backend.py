"""The critic trains through the torch backend: the same bits as a plain AdamW loop on the value
loss (how the critic trained before it went through a backend), for the built-in model."""

import attrs
import torch

from relax.algorithms import PolicyLossOutput, numerics
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.tiny.weights import load_warmup_model
from relax.models.value import ValueModel, response_values
from relax.config.run import RunConfig


def _batch() -> TokenBatch:
    g = torch.Generator().manual_seed(3)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return TokenBatch(prompt_ids=torch.randint(3, 17, (4, 5), generator=g), prompt_mask=torch.ones(4, 5, dtype=torch.bool),
                      response_ids=torch.randint(3, 17, (4, 4), generator=g), response_mask=response_mask)


def test_critic_backend_matches_a_plain_adamw_loop():
    config = attrs.evolve(RunConfig(), critic_lr=3e-3, clip_grad=0.5, value_clip=0.2)
    batch = _batch()
    returns = torch.tensor([[0.3, -0.2, 1.0, 0.7], [2.0, -1.0, 0.0, 0.0], [-0.5, 0, 0, 0], [0.1, 0.2, 0.4, 0]])
    tokens = float(batch.response_mask.sum())

    reference = ValueModel(load_warmup_model())
    optimizer = torch.optim.AdamW(reference.parameters(), lr=config.critic_lr, weight_decay=0.0)
    backend = TorchBackend.for_critic(config, ValueModel(load_warmup_model()))
    for _ in range(3):
        with torch.no_grad():
            reference.eval()
            old_ref = response_values(reference, batch)
        old = backend.compute_values(batch)
        assert torch.equal(old, old_ref)

        reference.train()
        optimizer.zero_grad(set_to_none=False)
        loss_ref, _ = numerics.value_loss(response_values(reference, batch), old_ref, returns, batch.response_mask,
                                          config.value_clip, "token_mean", global_num_tokens=tokens)
        loss_ref.backward()
        norm_ref = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), config.clip_grad))
        optimizer.step()

        def loss_fn(out, micro):
            loss, clipfrac = numerics.value_loss(out.values, old[micro], returns[micro], batch.response_mask[micro],
                                                 config.value_clip, "token_mean", global_num_tokens=tokens)
            return PolicyLossOutput(loss=loss, metrics={"value_clipfrac": clipfrac})

        metrics = backend.train_step(batch, loss_fn, with_entropy=False)
        assert metrics["loss"] == float(loss_ref.detach())
        assert metrics["grad_norm"] == norm_ref
    for (name, a), b in zip(reference.state_dict().items(), backend.model.state_dict().values()):
        assert torch.equal(a, b), name
