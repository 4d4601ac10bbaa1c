"""``relax sft`` through the command line: bad input refused before anything heavy, the flags' effect
on the run's shape, and the tiny model trained from a JSONL whose checkpoint ``relax train --load``
starts from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax.cli.main import build_parser
from relax.cli.sft_cmd import prepare
from relax.rollout.tasks.addition import all_problems, held_out_problems

pytestmark = pytest.mark.real_preflight  # the real built-in task and pre-flight (tests/cli/conftest.py)


def demonstrations(path: Path, keys=("prompt", "completion")) -> Path:
    held_out = {p.text for p in held_out_problems()}
    rows = [{keys[0]: p.text, keys[1]: f"<a>{p.label}</a>"} for p in all_problems() if p.text not in held_out]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prepared(*argv):
    parser, subparsers = build_parser()
    args = parser.parse_args(["sft", *map(str, argv)])
    return prepare(args, subparsers["sft"])


def test_epochs_batch_size_and_keys_shape_the_run(tmp_path):
    data = demonstrations(tmp_path / "d.jsonl", keys=("question", "answer"))
    config, sft, examples, pad_id = _prepared("--data", data, "--prompt-key", "question", "--completion-key", "answer",
                                              "--num-epochs", 3, "--batch-size", 7, "--output-dir", tmp_path / "o")
    assert len(examples) == 80 and pad_id == 0
    assert config.num_rollout == 3 * 12  # ceil(80 / 7) steps per epoch
    assert (sft.num_epochs, sft.batch_size, sft.prompt_key) == (3, 7, "question")
    assert config.num_steps_per_rollout == 1 and config.rollout_temperature == 1.0  # plain NLL, no tempering


@pytest.mark.parametrize(("rows", "expected"), [
    (None, "--data {data}: no such file or directory"),
    ([{"prompt": "<bos>1+1=", "completion": "<a>2</a>"}, {"prompt": "<bos>1+2=", "answer": "<a>3</a>"}],
     ("--data {data}: 1 bad line (fix or remove them; nothing is skipped silently):\n"
      "  line 2: no key 'completion' (--completion-key); the row's keys: 'prompt', 'answer'")),
    ([{"prompt": "<bos>1+1=", "completion": ""}], "line 1: key 'completion' is empty"),
])
def test_bad_input_exits_2_naming_file_row_and_key_before_training(cli, tmp_path, rows, expected):
    data = tmp_path / "d.jsonl"
    if rows is not None:
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = cli("sft", "--data", data, "--output-dir", tmp_path / "o")
    assert code == 2
    assert expected.format(data=data) in err
    assert not (tmp_path / "o").exists()  # refused before the run directory, the model or the backend


def test_dry_run_checks_the_data_and_writes_nothing(cli, tmp_path):
    code, out, err = cli("sft", "--data", demonstrations(tmp_path / "d.jsonl"), "--output-dir", tmp_path / "o",
                         "--batch-size", 5, "--dry-run")
    assert code == 0, err
    assert "batch_size: 5\n" in out and "num_epochs: 1\n" in out
    assert not (tmp_path / "o").exists()


def test_no_data_flag(cli, tmp_path):
    code, _, err = cli("sft", "--output-dir", tmp_path / "o")
    assert code == 2 and "--data is required" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sft_trains_the_tiny_model_and_relax_train_starts_from_it(cli, tmp_path):
    data = demonstrations(tmp_path / "d.jsonl")
    sft_dir, rl_dir = tmp_path / "sft", tmp_path / "rl"
    code, _, err = cli("sft", "--data", data, "--output-dir", sft_dir, "--lr", "3e-3", "--batch-size", 16,
                       "--num-epochs", 4, "--eval-interval", 10, "--no-progress", "--log-interval", 5)
    assert code == 0, err
    assert "relax sft: step 5/20 | loss" in err and "tokens/s" in err
    rows = [json.loads(line) for line in (sft_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "sft/loss" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    assert train[-1]["sft/loss"] < 0.6 * train[0]["sft/loss"]
    assert all(r["sft/tokens_per_s"] > 0 and r["sft/loss_tokens"] > 0 for r in train)
    evals = [r for r in rows if "eval/pass@1" in r]
    assert [r["eval/policy_version"] for r in evals] == [0, 10, 20]
    assert evals[-1]["eval/correct/mean"] > evals[0]["eval/correct/mean"]  # 0.15 for the warm-up
    step = sft_dir / "checkpoints" / "step_000020"
    assert {p.name for p in step.iterdir()} == {"state.pt", "model.pt", "sft.json"}

    # relax train --load of the SFT run: a new RL run from its weights (policy, reference, rollout engine)
    code, _, err = cli("train", "--load", sft_dir, "--num-rollout", 1, "--in-process", "--output-dir", rl_dir,
                       "--no-progress")
    assert code == 0, err
    rl_rows = [json.loads(line) for line in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in rl_rows if r["step"] == 0)
    same = [k for k in evals[-1] if k.startswith("eval/") and k != "eval/policy_version"]
    assert {k: before[k] for k in same} == {k: evals[-1][k] for k in same}  # the greedy evaluation of the SFT model
    assert "resumed" not in err and "warm-up base rates" not in err  # not the shipped warm-up's numbers


def test_train_load_of_an_hf_sft_checkpoint_points_at_hf(cli, tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step_000003"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    (step / "sft.json").write_text(json.dumps({"model": "hf", "task": "addition"}))
    code, _, err = cli("train", "--load", tmp_path / "run", "--output-dir", tmp_path / "o", "--dry-run")
    assert code == 2
    assert f"a relax sft checkpoint of a Hugging Face model; start from it with --hf-checkpoint {step / 'hf'}" in err


@pytest.mark.parametrize(("marker", "flags", "expected"), [
    ({"model": "tiny", "task": "addition"}, ("--hf-checkpoint", "HF"),
     "holds the built-in model's weights (a relax sft checkpoint), which --hf-checkpoint"),
    ({"model": "tiny", "task": "addition"}, ("--task", "calculator"),
     "trained the built-in model of --task addition, this run has --task calculator; pass --task addition"),
])
def test_train_load_of_a_tiny_sft_checkpoint_refuses_another_model(cli, tmp_path, marker, flags, expected):
    step = tmp_path / "run" / "checkpoints" / "step_000003"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    (step / "sft.json").write_text(json.dumps(marker))
    if "HF" in flags:
        from relax.models.hf.tiny_random import build_tiny_random_checkpoint

        flags = ("--hf-checkpoint", build_tiny_random_checkpoint(tmp_path / "hf", "llama"),
                 "--prompt-data", demonstrations(tmp_path / "p.jsonl"), "--custom-rm-path", "relax.rewards.math:score")
    code, _, err = cli("train", "--load", tmp_path / "run", "--output-dir", tmp_path / "o", "--dry-run", *flags)
    assert code == 2
    assert expected in err


def _stop_after(monkeypatch, stop_step: int, signum: int):
    """Deliver ``signum`` to this process while step ``stop_step`` trains (as Ctrl-C / kill would)."""
    import signal

    import relax.recipes.sft as sft_recipe

    real, calls = sft_recipe.train_one_step, []

    def train_one_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == stop_step:
            signal.raise_signal(signum)  # handled between steps: this step still finishes
        return real(*args, **kwargs)

    monkeypatch.setattr(sft_recipe, "train_one_step", train_one_step)
    return monkeypatch


def _final_state(run_dir: Path, step: int) -> dict:
    import torch

    return torch.load(run_dir / "checkpoints" / f"step_{step:06d}" / "state.pt", weights_only=False)["actor"]["backend"]


def _train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("sft/tokens_per_s", "time/step_s")} for r in rows]


def test_a_stopped_sft_run_saves_and_resumes_bit_identically(cli, tmp_path, monkeypatch):
    import signal

    import torch

    data = demonstrations(tmp_path / "d.jsonl")
    flags = ("--data", data, "--batch-size", 20, "--num-epochs", 2, "--lr", "3e-3", "--lr-decay-style", "cosine",
             "--no-eval", "--no-progress", "--use-tensorboard")  # 8 steps, a schedule whose rate depends on the step
    code, _, err = cli("sft", *flags, "--output-dir", tmp_path / "whole")
    assert code == 0, err

    with monkeypatch.context() as m:
        _stop_after(m, 3, signal.SIGTERM)
        code, _, err = cli("sft", *flags, "--output-dir", tmp_path / "cut")
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping after the step in progress" in err
    assert f"saved step 3 to {tmp_path / 'cut' / 'checkpoints'} (resume with relax sft --load {tmp_path / 'cut'}" in err
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step_000003"]
    assert [r["step"] for r in _train_rows(tmp_path / "cut")] == [1, 2, 3]

    code, _, err = cli("sft", *flags, "--load", tmp_path / "cut")  # continues in the loaded run's directory
    assert code == 0, err
    assert "resumed after step 3" in err
    whole, cut = _final_state(tmp_path / "whole", 8), _final_state(tmp_path / "cut", 8)
    assert cut["step"] == whole["step"] == 8
    assert whole["model"].keys() == cut["model"].keys()
    assert all(torch.equal(whole["model"][k], cut["model"][k]) for k in whole["model"])
    for a, b in zip(whole["optimizer"]["state"].values(), cut["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert _train_rows(tmp_path / "cut") == _train_rows(tmp_path / "whole")  # rows 1..8 once, the same losses
    whole_tb, cut_tb = _tensorboard_losses(tmp_path / "whole"), _tensorboard_losses(tmp_path / "cut")
    assert sorted(cut_tb) == list(range(1, 9)) and cut_tb == whole_tb  # TensorBoard keeps steps 1..3 of the first part


def _tensorboard_losses(run_dir: Path) -> dict[int, float]:
    """``{step: sft/loss}`` as TensorBoard shows it (a purged step is hidden)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("sft/loss")}


def test_ctrl_c_before_a_save_interval_saves_the_last_finished_step(cli, tmp_path, monkeypatch):
    import signal

    data = demonstrations(tmp_path / "d.jsonl")
    _stop_after(monkeypatch, 2, signal.SIGINT)
    code, _, err = cli("sft", "--data", data, "--batch-size", 40, "--num-epochs", 2, "--no-eval", "--no-progress",
                       "--save-interval", 1, "--output-dir", tmp_path / "o")
    assert code == 130, err
    assert "relax sft: saved step 2" in err and "--load" in err
    assert sorted(p.name for p in (tmp_path / "o" / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


@pytest.mark.parametrize(("flags", "expected"), [
    (("--batch-size", 30), ("--batch-size 30 differs from the checkpoint's --batch-size 40; the resumed run must "
                            "see the same batches, so pass --batch-size 40")),
    (("--seed", 7), "--seed 7 differs from the checkpoint's --seed"),
    (("--data", "OTHER"), "--data {other} is not the file the checkpoint trained on ({data}, whose contents differ)"),
])
def test_sft_load_refuses_another_data_order_naming_the_flag(cli, tmp_path, monkeypatch, flags, expected):
    import signal

    data = demonstrations(tmp_path / "d.jsonl")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(data.read_text().splitlines(keepends=True)[::-1]))  # the same rows, another order
    _stop_after(monkeypatch, 1, signal.SIGINT)
    code, _, err = cli("sft", "--data", data, "--batch-size", 40, "--num-epochs", 2, "--no-eval", "--no-progress",
                       "--output-dir", tmp_path / "o")
    assert code == 130, err
    monkeypatch.undo()
    argv = {"--data": data, "--batch-size": 40, "--num-epochs": 2}
    argv.update(dict(zip(flags[::2], flags[1::2])))
    argv = [str(other) if v == "OTHER" else v for pair in argv.items() for v in pair]
    code, _, err = cli("sft", *argv, "--no-eval", "--load", tmp_path / "o")
    assert code == 2
    assert expected.format(other=other, data=data) in err
    assert [r["step"] for r in _train_rows(tmp_path / "o")] == [1]  # nothing was touched


def test_sft_load_refuses_what_it_cannot_continue(cli, tmp_path, monkeypatch):
    import torch

    data = demonstrations(tmp_path / "d.jsonl")
    not_sft = tmp_path / "rl" / "checkpoints" / "step_000001"
    not_sft.mkdir(parents=True)
    torch.save({"step": 1}, not_sft / "state.pt")
    code, _, err = cli("sft", "--data", data, "--no-eval", "--load", tmp_path / "rl")
    assert code == 2 and "not a relax sft checkpoint (no sft.json in its step directory)" in err

    code, _, err = cli("sft", "--data", data, "--batch-size", 40, "--no-eval", "--no-progress", "--output-dir",
                       tmp_path / "o")
    assert code == 0, err
    code, _, err = cli("sft", "--data", data, "--batch-size", 40, "--no-eval", "--load", tmp_path / "o")
    assert code == 2 and "its step 2 already completes this run's 2 steps; raise --num-epochs" in err


def test_a_resumed_run_keeps_the_first_runs_evaluation_in_its_summary(cli, tmp_path, monkeypatch):
    import signal

    data = demonstrations(tmp_path / "d.jsonl")
    flags = ("--data", data, "--batch-size", 40, "--lr", "3e-3", "--no-progress", "--output-dir", tmp_path / "o")
    with monkeypatch.context() as m:
        _stop_after(m, 1, signal.SIGINT)
        code, _, err = cli("sft", *flags)
    assert code == 130, err
    before = next(r for r in _train_rows(tmp_path / "o") if r["step"] == 0)
    code, _, err = cli("sft", *flags, "--load", tmp_path / "o")
    assert code == 0, err
    rows = _train_rows(tmp_path / "o")
    assert [r["step"] for r in rows] == [0, 1, 2]  # the evaluation before training is not repeated
    assert f": {before['eval/pass@1']:.2f} -> " in err and "(step 0 -> step 2)" in err


def test_any_micro_batch_size_splits_an_sft_batch(cli, tmp_path):
    """relax train's batch-shape rule is about rollout groups: an SFT batch of 6 takes micro-batches of 5
    (5 + 1 rows), and trains as the whole batch does, up to the order of the sums."""
    import torch

    rows = [json.loads(line) for line in demonstrations(tmp_path / "all.jsonl").read_text().splitlines()[:12]]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {}
    for name, extra in (("whole", ()), ("micro", ("--micro-batch-size", 5))):
        code, _, err = cli("sft", "--data", data, "--batch-size", 6, "--output-dir", tmp_path / name, "--no-eval",
                           "--no-progress", *extra)
        assert code == 0, err
        runs[name] = (_train_rows(tmp_path / name), _final_state(tmp_path / name, 2)["model"])
    (whole_rows, whole), (micro_rows, micro) = runs["whole"], runs["micro"]
    assert [r["sft/loss"] for r in micro_rows] == pytest.approx([r["sft/loss"] for r in whole_rows], rel=1e-5)
    for name, value in whole.items():
        torch.testing.assert_close(micro[name], value, rtol=1e-4, atol=1e-4)  # Adam: a step of ~lr either way
