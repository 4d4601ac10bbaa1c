"""The optimization and memory flags through ``relax train`` (a real command line, parsed and
validated by the CLI, run on the session's shared Ray cluster): the logged learning rate follows the
schedule, the checkpoint's optimizer carries the Adam / weight-decay flags, and bf16 + recompute
train; bad values stop the command naming the flag."""

from __future__ import annotations

import json

import pytest
import torch

from relax.runtime.files.checkpoint_files import checkpoint_path

LR, MIN_LR = 1e-3, 1e-4


def _parse(*flags):
    from relax.cli.main import build_parser, prepare_train_config

    parser, subparsers = build_parser()
    return prepare_train_config(["train", *map(str, flags)], parser, subparsers["train"])[0]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore")
def test_relax_train_with_schedule_weight_decay_adam_flags_bf16_and_recompute(ray_cluster, tmp_path):
    from relax.runtime.driver.train import run

    out = tmp_path / "run"
    # reinforce++ drops no prompt group, so every rollout runs its 2 optimizer steps: 4 in all
    config = _parse(
        "--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages", "--num-rollout", 2, "--rollout-batch-size", 4,
        "--n-samples-per-prompt", 4, "--num-steps-per-rollout", 2, "--lr", LR, "--lr-warmup-steps", 2,
        "--lr-decay-style", "linear", "--min-lr", MIN_LR, "--weight-decay", 0.1, "--adam-beta1", 0.85,
        "--adam-beta2", 0.99, "--adam-eps", 1e-6, "--bf16", "--recompute-activations", "--seed", 5,
        "--save-interval", 2, "--output-dir", out, "--no-progress",
    )
    assert config.total_optimizer_steps() == 4
    run(config)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > 0]  # the training steps (step 0: the evaluation before training)
    # per-step rates: warm-up LR/2, LR; then linear over steps 2..3 of 4: LR, MIN + (LR - MIN) / 2.
    # actor/lr is the mean over the rollout's two optimizer steps.
    expected = [0.75 * LR, (LR + MIN_LR + (LR - MIN_LR) / 2) / 2]
    assert [r["actor/lr"] for r in rows] == pytest.approx(expected)
    assert all(r["actor/optimizer_state_mib"] > 0 and r["actor/grad_norm"] > 0 for r in rows)
    state = torch.load(checkpoint_path(out, 2), weights_only=False)["actor"]["backend"]
    assert state["step"] == 4
    groups = state["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(g["betas"] == (0.85, 0.99) and g["eps"] == 1e-6 for g in groups)
    decayed = {state["optimizer_param_names"][i] for i in groups[0]["params"]}
    assert "blocks.0.attn.q_proj.weight" in decayed and "blocks.0.attn.q_proj.bias" not in decayed
    assert all(v.dtype == torch.float32 for v in state["model"].values())  # bf16: float32 master weights


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--min-lr", "1e-5"), "--min-lr 1e-05 has no effect with --lr-decay-style constant"),
        (("--lr", "1e-4", "--min-lr", "1e-3", "--lr-decay-style", "cosine"), "--min-lr 0.001 must not exceed --lr"),
        (("--adam-beta2", "1"), "--adam-beta2: must be in [0, 1)"),
        (("--lr-warmup-steps", "-2"), "--lr-warmup-steps: must be >= 0"),
        (("--lr-decay-style", "step"), "--lr-decay-style: invalid choice"),
        (("--lora-alpha", "32"), "--lora-alpha has no effect without --lora-rank"),
        (("--lora-rank", "8"), "--lora-rank adapts a Hugging Face model: give --hf-checkpoint"),
        (("--lora-dropout", "1"), "--lora-dropout: must be in [0, 1)"),
    ],
)
def test_bad_optimization_flags_stop_the_command_naming_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit):
        _parse("--no-progress", *flags)
    assert message in capsys.readouterr().err
