"""``relax train --rollout-engine vllm`` end to end (Ray, TransferQueue, Serve): GDPO with a
two-component reward on a tiny random Qwen2, a large learning rate so the policy moves every step,
and evaluation with the vLLM engine. ``rollout/logprob_abs_diff`` (mean |engine - trainer| log-prob)
stays below 1e-3 on every step only if the engine holds the trainer's new weights each time: a stale
engine is >= 0.1 away after one update (tests/vllm_engine/test_vllm_engine.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest
import torch
from vllm_checkpoints import tiny_qwen2

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig

HERE = Path(__file__).parent


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _config(ckpt, tmp_path, **overrides) -> RunConfig:
    train = _write(tmp_path / "train.jsonl", [{"q": f"What is {i} + 3?", "a": i + 3} for i in range(16)])
    evals = _write(tmp_path / "eval.jsonl", [{"q": f"Add {i} and {i}.", "a": 2 * i} for i in range(3)])
    config = RunConfig(
        advantage_estimator="gdpo", algorithm=AlgorithmConfig(reward_keys=("digits", "stops"), n_samples_per_prompt=4),
        hf_checkpoint=str(ckpt), rollout_engine="vllm", prompt_data=train, input_key="q", label_key="a",
        custom_rm_path="toy_reward:reward", eval_prompt_data=evals, rollout_batch_size=4, num_steps_per_rollout=1,
        num_rollout=4, lr=1e-2, rollout_max_response_len=8, output_dir=str(tmp_path / "run"), progress=False,
        max_sampling_rounds=3,  # refill a step whose groups carry no signal
    )
    return attrs.evolve(config, **overrides)


@pytest.fixture
def run_in_cluster(ray_cluster, monkeypatch):
    from relax.runtime.driver.train import run

    shutil.copy(HERE.parent / "hf" / "toy_reward.py", ray_cluster / "toy_reward.py")
    monkeypatch.chdir(ray_cluster)
    return run


def _check_run(out: Path, steps: int) -> list[dict]:
    """Every step that trained logs the mismatch, below 1e-3. A step trains nothing only when every
    prompt group was dropped for lack of signal (the lr makes the random policy collapse fast); the
    refill rounds make that rare, and at most one such step is accepted."""
    rows = [r for r in _rows(out) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    trained = [r for r in rows if not r.get("train/skipped")]
    assert len(trained) >= steps - 1, rows
    print("rollout/logprob_abs_diff by step:", {r["step"]: r["rollout/logprob_abs_diff"] for r in trained})
    for r in trained:
        assert r["rollout/logprob_abs_diff"] < 1e-3, (r["step"], r["rollout/logprob_abs_diff"])
    return rows


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gdpo_trains_with_the_vllm_engine_holding_the_trainers_weights(run_in_cluster, tmp_path):
    from relax.models.hf.loading import load_hf_model
    ckpt = tiny_qwen2(tmp_path / "tiny-qwen2")
    config = _config(ckpt, tmp_path, max_prompt_len=64)  # the engine then reserves 64 + 8 tokens per sequence
    summary = run_in_cluster(config)
    _check_run(Path(config.output_dir), 4)
    # the policy really moved (a stale engine would then be far off), and the vLLM engine evaluated it
    start = load_hf_model(ckpt).state_dict()
    final = {k: v for k, v in summary_weights(Path(config.output_dir)).items() if k in start}
    assert max(float((final[k].float() - start[k].float()).abs().max()) for k in final) > 1e-2
    evals = [r for r in _rows(Path(config.output_dir)) if "eval/num_prompts" in r]  # before and after
    assert [r["eval/num_prompts"] for r in evals] == [3, 3]
    assert summary.eval_after["eval/policy_version"] == 4


def summary_weights(out: Path) -> dict[str, torch.Tensor]:
    """The last checkpoint's policy weights."""
    from relax.runtime.files.checkpoint_files import checkpoint_path

    return torch.load(checkpoint_path(out, 4), weights_only=False)["actor"]["backend"]["model"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_vllm_rollout_workers_in_a_fully_async_run(run_in_cluster, tmp_path):
    """Each of two rollout workers holds its own vLLM engine, and each gets every new policy. With
    --max-staleness 0 every step samples with the policy the trainer holds, so the mismatch stays at
    float rounding; with a larger bound it also measures the policy lag (docs/en/rollout-engines.md)."""
    ckpt = tiny_qwen2(tmp_path / "tiny-qwen2", seed=1)
    config = _config(ckpt, tmp_path, rollout_num_workers=2, fully_async=True, max_staleness=0,
                     eval_prompt_data=None)
    run_in_cluster(config)
    rows = _check_run(Path(config.output_dir), 4)
    assert [r["async/policy_version"] for r in rows] == [0, 1, 2, 3]


STOPS = tuple("0123456789fghkquwxyz")  # none of them is in the tokenizer's special tokens


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_vllm_sampling_flags_reach_the_engine(run_in_cluster, tmp_path):
    """--rollout-stop ends completions at the first stop string (kept); --rollout-top-k and
    --rollout-min-p truncate the engine's distribution, so with --full-vocabulary-log-probs (the trainer
    scores the whole vocabulary) rollout/logprob_abs_diff rises far above the float rounding it shows
    without them (test_gdpo_trains_with_the_vllm_engine_holding_the_trainers_weights)."""
    ckpt = tiny_qwen2(tmp_path / "tiny-qwen2", seed=2)
    config = _config(ckpt, tmp_path, num_rollout=2, eval_prompt_data=None, rollout_top_k=3, rollout_min_p=0.05,
                     rollout_stop=STOPS, log_completions=16)
    config = attrs.evolve(config, algorithm=attrs.evolve(config.algorithm, full_vocabulary_log_probs=True))
    run_in_cluster(config)
    out = Path(config.output_dir)
    rows = [r for r in _rows(out) if not r.get("train/skipped")]
    assert rows and all(r["rollout/logprob_abs_diff"] > 1e-2 for r in rows), rows
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    stopped = 0
    for sample in samples:
        text = sample["completion"]
        for special in ("<eos>", "<|im_end|>"):
            text = text.removesuffix(special)
        first = min((text.index(s) for s in STOPS if s in text), default=None)
        if first is not None:
            stopped += 1
            assert first == len(text) - 1, f"the completion goes on after a stop string: {sample['completion']!r}"
    assert stopped > 0


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_trainer_replays_vllms_truncated_sampling(run_in_cluster, tmp_path):
    """min-p, top-k and top-p together: the trainer replays the kept set vLLM sampled from (temperature,
    min-p, top-k, top-p, renormalized; relax.models.sampled_distribution), so at step 1, before any
    update, every importance weight is 1 and the engine's and trainer's log-probs agree to float rounding
    (with --full-vocabulary-log-probs the same settings put them > 1e-2 apart, the test above). The
    schedule is synchronous, so step 2 (after an update the engine receives) is on-policy too."""
    ckpt = tiny_qwen2(tmp_path / "tiny-qwen2", seed=3)
    config = _config(ckpt, tmp_path, num_rollout=2, eval_prompt_data=None, rollout_top_k=5, rollout_min_p=0.1,
                     rollout_top_p=0.7, rollout_temperature=0.9)
    config = attrs.evolve(config, algorithm=attrs.evolve(config.algorithm, off_policy_correction="tis"))
    run_in_cluster(config)
    trained = [r for r in _rows(Path(config.output_dir)) if r["step"] > 0 and not r.get("train/skipped")]
    assert trained  # a step trains nothing only when every group lacks signal after the refill rounds
    for row in trained:
        assert row["rollout/logprob_abs_diff"] < 1e-4, (row["step"], row["rollout/logprob_abs_diff"])
        assert row["actor/off_policy_weight"] == pytest.approx(1.0, abs=1e-3)
        assert row["off_policy/weight_max"] == pytest.approx(1.0, abs=1e-3)
