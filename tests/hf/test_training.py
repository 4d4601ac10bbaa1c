"""TorchBackend on Hugging Face models: log-probs, GRPO / GDPO steps, weight sync, checkpoints."""

import pytest
import torch

from relax.algorithms import AdvantageInputs, AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.backends.torch_backend import TorchBackend
from relax.rollout.base import SamplingParams
from relax.models.hf import export_hf_checkpoint, hf_forward_logits, load_hf_model, load_hf_tokenizer, save_hf_checkpoint
from relax.rollout.hf import HFEngine

PROMPTS = ["what is 3 + 4 ?", "hello", "add the numbers 1 and 2 please", "yes"]


def plain_log_probs(model, batch):
    """Reference: one forward per row over its real tokens only (no padding), log_softmax, gather."""
    out = torch.zeros(batch.response_ids.shape)
    for i in range(len(batch)):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
        response = batch.response_ids[i][batch.response_mask[i]]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0]
        lp = torch.log_softmax(logits[len(prompt) - 1 : -1].double(), -1)
        out[i, : len(response)] = lp.gather(1, response[:, None]).squeeze(1).float()
    return out


@pytest.fixture
def setup(checkpoints, request):
    family = getattr(request, "param", "qwen3")
    path = checkpoints[family]
    tok = load_hf_tokenizer(path)
    engine = HFEngine(load_hf_model(path), tok)
    backend = TorchBackend(load_hf_model(path), lr=1e-2, forward_logits=hf_forward_logits)
    return path, tok, engine, backend


@pytest.mark.parametrize("setup", ["llama", "qwen2", "qwen3", "llama-tied"], indirect=True)
def test_backend_log_probs_equal_plain_forward_and_engine(setup):
    _, tok, engine, backend = setup
    gen = engine.generate(
        [tok.encode(p) for p in PROMPTS] * 2,
        SamplingParams(max_new_tokens=8),
        torch.Generator().manual_seed(1),
    )
    scored = backend.compute_log_probs(gen.batch, with_entropy=True)
    torch.testing.assert_close(scored.log_probs, plain_log_probs(backend.model, gen.batch), atol=2e-5, rtol=0)
    torch.testing.assert_close(scored.log_probs, gen.log_probs, atol=2e-5, rtol=0)
    assert (scored.entropy[gen.batch.response_mask] > 0).all()
    assert (scored.entropy[~gen.batch.response_mask] == 0).all()


def rewards_for(tok, batch, keys):
    """Two components per sample: the share of response tokens that are "yes", and the share that
    are digits. Both vary across samples of a group, so every group carries signal."""
    yes = tok.hf.convert_tokens_to_ids("yes")
    digits = torch.tensor(tok.hf.convert_tokens_to_ids([str(d) for d in range(10)]))
    mask = batch.response_mask
    n = mask.sum(1).clamp(min=1)
    comps = {
        "yes": ((batch.response_ids == yes) & mask).sum(1) / n,
        "digits": (torch.isin(batch.response_ids, digits) & mask).sum(1) / n,
    }
    return torch.stack([comps[k].float() for k in keys], dim=1)


def prob_of_token(backend, batch, token_id):
    """Mean probability of ``token_id`` at every response position of ``batch`` (teacher forced)."""
    with torch.no_grad():
        logits = hf_forward_logits(backend.model, batch.input_ids, batch.attention_mask, batch.position_ids)
    p = batch.prompt_width
    probs = torch.softmax(logits[:, p - 1 : -1].float(), -1)[..., token_id]
    return float(probs[batch.response_mask].mean())


@pytest.mark.parametrize(
    "name,keys,weights", [("grpo", ("yes",), None), ("gdpo", ("yes", "digits"), (1.0, 0.5))]
)
def test_a_few_rl_steps_raise_the_rewarded_token(setup, name, keys, weights):
    """Rollout -> rewards -> normalize_rewards -> compute_advantages -> policy_loss steps -> weight
    sync, exactly the pipeline's order; the rewarded token must become more likely."""
    _, tok, engine, backend = setup
    algo = get_algorithm(name)(
        AlgorithmConfig(n_samples_per_prompt=8, reward_keys=keys, reward_weights=weights)
    )
    params = SamplingParams(max_new_tokens=6)
    generator = torch.Generator().manual_seed(0)
    prompt_ids = [tok.encode(p) for p in PROMPTS]
    samples = [ids for ids in prompt_ids for _ in range(8)]
    group_ids = torch.arange(len(prompt_ids)).repeat_interleave(8)
    probe = engine.generate(samples, params, torch.Generator().manual_seed(99)).batch
    yes = tok.hf.convert_tokens_to_ids("yes")
    before = prob_of_token(backend, probe, yes)
    for _ in range(4):
        gen = engine.generate(samples, params, generator)
        rewards = rewards_for(tok, gen.batch, keys)
        keep = algo.group_has_signal(rewards, group_ids)
        rows = keep.nonzero().squeeze(1)
        batch = gen.batch.select(rows)
        scalar = algo.normalize_rewards(rewards[rows], group_ids[rows])
        advantages, _ = algo.compute_advantages(
            AdvantageInputs(rewards=scalar, response_mask=batch.response_mask)
        )
        old = backend.compute_log_probs(batch).log_probs
        # On-policy: the engine's sampling log-probs are the trainer's old log-probs.
        torch.testing.assert_close(old, gen.log_probs[rows], atol=5e-5, rtol=0)
        n_tokens = float(batch.response_mask.sum())

        def loss_fn(lp, sl, batch=batch, old=old, advantages=advantages, n_tokens=n_tokens):
            return algo.policy_loss(
                PolicyLossInputs(
                    log_probs=lp.log_probs,
                    old_log_probs=old[sl],
                    advantages=advantages[sl],
                    response_mask=batch.response_mask[sl],
                    entropy=lp.entropy,
                    global_num_tokens=n_tokens,
                    global_num_sequences=float(len(batch)),
                )
            )

        metrics = backend.train_step(batch, loss_fn, micro_batch_size=16)
        assert metrics["grad_norm"] > 0
        engine.load_weights(backend.export_weights())
    after = prob_of_token(backend, probe, yes)
    assert after > 2 * before, (before, after)
    # The engine holds the trained weights: its sampling log-probs match the trainer again.
    gen = engine.generate(samples[:8], params, generator)
    torch.testing.assert_close(
        backend.compute_log_probs(gen.batch).log_probs, gen.log_probs, atol=5e-5, rtol=0
    )


@pytest.mark.parametrize("setup", ["qwen3", "llama-tied"], indirect=True)
def test_save_pretrained_checkpoint_reloads_identically(setup, tmp_path):
    path, tok, _, backend = setup
    with torch.no_grad():  # make the weights differ from the source checkpoint
        for p in backend.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = save_hf_checkpoint(backend.model, tmp_path / "ckpt", tokenizer_source=path)
    reloaded = load_hf_model(out)
    ids = torch.tensor([tok.encode("add the numbers 1 and 2 please")])
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, backend.model(input_ids=ids).logits, atol=0, rtol=0
        )
    assert load_hf_tokenizer(out).encode("hello world") == tok.encode("hello world")
    # From exported weights only (a process that does not hold the HF module).
    out2 = export_hf_checkpoint(backend.export_weights(), path, tmp_path / "ckpt2")
    with torch.no_grad():
        torch.testing.assert_close(
            load_hf_model(out2)(input_ids=ids).logits, backend.model(input_ids=ids).logits, atol=0, rtol=0
        )
    # Plain transformers loads it too (nothing relax-specific in the directory).
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert type(plain) is type(backend.model)


def test_save_needs_a_tokenizer(setup, tmp_path):
    _, _, _, backend = setup
    with pytest.raises(ValueError, match="tokenizer"):
        save_hf_checkpoint(backend.model, tmp_path / "x")
