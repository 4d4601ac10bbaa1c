"""``relax.recipes.sft``: the loss against a float64 reference, through the torch backend's micro-batch
and packed passes, and the epochs' batches."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch

from relax.backends.torch_backend import TorchBackend
from relax.config.run import RunConfig
from relax.config.sft import SftConfig
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig
from relax.recipes.sft import epoch_batches, sft_loss_fn, total_steps, train_one_step
from relax.rollout.sft_data import SftExample, sft_batch

# different prompt and response lengths, and a masked response token in the middle (a chat's user turn)
EXAMPLES = [
    SftExample((1, 3, 13, 4, 14), (15, 10, 16, 2), (True, True, True, True)),
    SftExample((1, 9, 14), (15, 3, 11, 16, 2, 7), (True, False, True, True, True, False)),
    SftExample((1, 5, 13, 5, 14, 6, 6), (15, 2), (True, True)),
]


def reference_nll(model: TinyCausalLM, examples) -> float:
    """Token-mean NLL of the trained tokens, each sequence unpadded, in float64."""
    model64 = TinyCausalLM(model.config).double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    model64.requires_grad_(False)
    total, count = 0.0, 0
    for e in examples:
        ids = torch.tensor([[*e.prompt_ids, *e.response_ids]])
        log_probs = torch.log_softmax(model64(ids)[0].double(), dim=-1)
        p = len(e.prompt_ids)
        for t, (token, trained) in enumerate(zip(e.response_ids, e.loss_mask)):
            if trained:
                total -= float(log_probs[p + t - 1, token])  # token p + t is predicted from column p + t - 1
                count += 1
    return total / count


@pytest.mark.parametrize("mode", ["whole", "micro", "packed"])
def test_loss_is_the_token_mean_nll_of_the_trained_tokens(mode):
    torch.manual_seed(0)
    model = TinyCausalLM(TinyLMConfig())
    expected = reference_nll(model, EXAMPLES)
    settings = {"whole": {}, "micro": {"micro_batch_size": 1}, "packed": {"max_tokens_per_micro_batch": 16}}[mode]
    config = RunConfig(lr=1e-3, **settings)
    backend = TorchBackend.for_policy(config, model)
    row = train_one_step(backend, sft_batch(EXAMPLES, pad_id=0), config)
    assert row["sft/loss"] == pytest.approx(expected, rel=1e-5)
    assert row["sft/loss_tokens"] == 10 and row["sft/tokens_per_s"] > 0 and row["sft/grad_norm"] > 0


def test_packed_and_micro_batched_steps_have_the_plain_steps_gradient():
    def first_step(**settings):
        torch.manual_seed(0)
        config = RunConfig(lr=1e-2, **settings)
        backend = TorchBackend.for_policy(config, TinyCausalLM(TinyLMConfig()))
        return train_one_step(backend, sft_batch(EXAMPLES, pad_id=0), config)

    plain = first_step()
    for other in (first_step(micro_batch_size=2), first_step(max_tokens_per_micro_batch=12)):
        assert other["sft/loss"] == pytest.approx(plain["sft/loss"], rel=1e-5)
        assert other["sft/grad_norm"] == pytest.approx(plain["sft/grad_norm"], rel=1e-4)


def test_loss_fn_takes_row_index_tensors():
    batch = sft_batch(EXAMPLES, pad_id=0)
    log_probs = -torch.rand(batch.response_ids.shape) * batch.response_mask  # zero where masked, like the backend
    fn = sft_loss_fn(batch, num_tokens=10)
    whole = fn(type("LP", (), {"log_probs": log_probs})(), slice(0, 3)).loss
    rows = torch.tensor([2, 0])
    part = fn(type("LP", (), {"log_probs": log_probs[rows]})(), rows).loss
    assert float(whole) == pytest.approx(float(-log_probs.sum() / 10))
    assert float(part) == pytest.approx(float(-(log_probs[2].sum() + log_probs[0].sum()) / 10))


def test_every_epoch_covers_every_demonstration_in_its_own_order():
    examples = [SftExample((1,), (i + 2,), (True,)) for i in range(10)]
    sft = SftConfig(data="x", num_epochs=3, batch_size=4)
    batches = list(epoch_batches(examples, sft, seed=5))
    assert total_steps(10, sft) == len(batches) == 9
    assert [len(b) for _, b in batches] == [4, 4, 2] * 3
    orders = [[e.response_ids[0] for _, b in batches[i : i + 3] for e in b] for i in (0, 3, 6)]
    assert all(sorted(order) == list(range(2, 12)) for order in orders)
    assert orders[0] != orders[1]  # a fresh order per epoch
    assert batches == list(epoch_batches(examples, sft, seed=5))  # drawn from the seed alone
    assert [b for _, b in epoch_batches(examples, attrs.evolve(sft, num_epochs=1), seed=5)] == [b for _, b in batches[:3]]


def test_the_addition_teachers_demonstrations_are_the_training_problems_answered_right():
    from relax.recipes.addition_teacher import sft_arguments, teacher_steps, training_demonstrations
    from relax.rollout.tasks.addition import held_out_problems, score_components

    rows = training_demonstrations()
    held_out = {p.text for p in held_out_problems()}
    assert len(rows) == 80 and not held_out & {r["prompt"] for r in rows}
    for row in rows:  # the built-in reward gives full marks once the appended <eos> stops the answer
        a, b = (int(x) for x in row["prompt"].removeprefix("<bos>").rstrip("=").split("+"))
        scores = score_components(row["prompt"], row["completion"] + "<eos>", a + b, {})
        assert scores == {"correct": 1.0, "digits": 1.0, "format": 1.0, "length": 1.0}
    assert teacher_steps() == 300
    assert sft_arguments(Path("t"))[:5] == ["sft", "--data", str(Path("t") / "demos.jsonl"), "--output-dir", "t"]


def test_stop_requests_defer_the_first_signal_and_raise_on_the_second():
    import signal

    from relax.recipes.sft_resume import StopRequests

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    seen = []
    with pytest.raises(KeyboardInterrupt), StopRequests(on_first=seen.append) as stop:
        signal.raise_signal(signal.SIGTERM)  # the first: only noted, the step in progress goes on
        assert stop.signum == signal.SIGTERM and seen == [signal.SIGTERM]
        signal.raise_signal(signal.SIGINT)  # the second: at once
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_save_cut_short_leaves_no_step_directory_and_the_next_save_completes(tmp_path, monkeypatch):
    # a second Ctrl-C during the save: `--load DIR` must not find a step directory without its marker
    from relax.models.initial_weights import SFT_MARKER, sft_checkpoint
    from relax.recipes import sft_checkpoint as saving

    torch.manual_seed(0)
    model = TinyCausalLM(TinyLMConfig())
    backend = TorchBackend(model, lr=1e-3)
    config = RunConfig(num_rollout=4)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(saving, "write_marker", interrupted)  # the last file of the save
        with pytest.raises(KeyboardInterrupt):
            saving.save_sft_checkpoint(backend, config, tmp_path, 2, tiny_config=model.config)
    assert list((tmp_path / "checkpoints").iterdir()) == []  # neither step_000002 nor its partial directory
    assert sft_checkpoint(tmp_path) is None

    for step in (2, 2):  # a resumed run may save the same step again
        directory = saving.save_sft_checkpoint(backend, config, tmp_path, step, tiny_config=model.config)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000002"]
    assert (directory / SFT_MARKER).is_file() and (directory / "state.pt").is_file()
    assert sft_checkpoint(tmp_path)["dir"] == directory
