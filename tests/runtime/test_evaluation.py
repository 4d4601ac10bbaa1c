"""Evaluation during training (relax.runtime.driver.evaluation, docs/en/evaluation.md).

Without Ray: the built-in task's held-out split (fixed, disjoint from the training stream), the
evaluation flags' errors and warnings (shared by ``relax train`` and ``run(config)``), the evaluation
file with its own keys, and one worker's evaluation slice (sampling parameters, its own generator).
Through ``run``, on the session's Ray cluster: the embedded default evaluates before and after
training on the held-out problems (the number checked against ``greedy_accuracy``), every
``--eval-interval`` steps with two rollout workers, the samples go to ``completions.jsonl``; an
asynchronous run trains bit for bit as the same run without evaluation; an evaluation file with
custom keys gives pass@k from several sampled completions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import attrs
import pytest
import torch
from run_results import assert_same_weights, checkpoint_weights, metrics_rows

from relax.algorithms import AlgorithmConfig, load_algorithm
from relax.config.run import RunConfig
from relax.rollout.factory import build_eval_prompts, evaluation_source, reward_setup
from relax.rollout.tasks import get_task
from relax.rollout.tasks.addition import (
    HELD_OUT,
    AdditionPrompts,
    all_problems,
    greedy_accuracy,
    held_out_problems,
)
from relax.runtime.checks.validation import ConfigError, validate
from relax.runtime.driver.evaluation import pass_at_k
from relax.runtime.step.eval_sampling import sample_eval_slice

KEYS = ("correct", "digits", "format", "length")
GRPO = load_algorithm("grpo")


# -- the held-out split --------------------------------------------------------------------------


def test_held_out_split_is_fixed_balanced_and_never_trained_on():
    problems = held_out_problems()
    pairs = [(p.metadata["a"], p.metadata["b"]) for p in problems]
    assert pairs == [(0, 1), (0, 6), (1, 4), (1, 9), (2, 2), (2, 7), (3, 0), (3, 5), (4, 3), (4, 8),
                     (5, 1), (5, 6), (6, 4), (6, 9), (7, 2), (7, 7), (8, 0), (8, 5), (9, 3), (9, 8)]
    assert set(pairs) == HELD_OUT and held_out_problems() == problems  # fixed, in a fixed order
    assert all(p.text == f"<bos>{a}+{b}=" and p.label == a + b for p, (a, b) in zip(problems, pairs))
    assert sum(p.label >= 10 for p in problems) == 9  # two-digit answers: 45 %, as over all 100
    for seed in (0, 1, 1234):
        drawn = {(p.metadata["a"], p.metadata["b"]) for p in AdditionPrompts(seed).next_batch(3000)}
        assert not drawn & HELD_OUT
        assert drawn == {(p.metadata["a"], p.metadata["b"]) for p in all_problems()} - HELD_OUT  # all 80
    small = AdditionPrompts(0, max_operand=1).next_batch(200)  # (0, 1) is held out: 3 problems left
    assert {(p.metadata["a"], p.metadata["b"]) for p in small} == {(0, 0), (1, 0), (1, 1)}


def test_the_embedded_default_evaluates_on_the_held_out_problems_and_files_and_off_switches():
    config = RunConfig()
    assert evaluation_source(config) == "held-out"
    assert build_eval_prompts(config, get_task("addition").make_tokenizer()) == held_out_problems()
    assert evaluation_source(attrs.evolve(config, evaluate=False)) is None
    assert evaluation_source(attrs.evolve(config, prompt_data="x.jsonl")) is None
    assert evaluation_source(attrs.evolve(config, hf_checkpoint="some/dir")) is None
    assert evaluation_source(attrs.evolve(config, custom_rm_path="my_mod:reward")) is None
    assert evaluation_source(attrs.evolve(config, prompt_data="x.jsonl", eval_prompt_data="e.jsonl")) == "file"


# -- flags: errors and warnings, before anything starts ------------------------------------------


def _errors(**fields) -> str:
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), **fields)
    with pytest.raises(ConfigError) as info:
        validate(config, GRPO)
    return str(info.value)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_bad_evaluation_values_are_refused_naming_the_flag(tmp_path):
    assert "argument --eval-interval: -2 is out of range" in _errors(eval_interval=-2)
    assert "argument --eval-interval: 0 is out of range" in _errors(eval_interval=0)
    assert "--eval-n-samples-per-prompt: 0" in _errors(eval_n_samples_per_prompt=0)
    assert "--eval-temperature: -1.0" in _errors(eval_temperature=-1.0)
    assert "--eval-top-p: 0.0" in _errors(eval_top_p=0.0)
    assert "--eval-max-response-len: 0" in _errors(eval_max_response_len=0)
    assert "--eval-pass-threshold: nan" in _errors(eval_pass_threshold=float("nan"))
    missing = tmp_path / "nope.jsonl"
    assert f"--eval-prompt-data '{missing}' does not exist" in _errors(eval_prompt_data=str(missing))


def test_records_without_the_evaluation_keys_are_refused(tmp_path):
    data = _write(tmp_path / "eval.jsonl", [{"question": "<bos>1+2=", "answer": 3}] * 3)
    message = _errors(eval_prompt_data=data)
    assert "3 of 3 records have no 'prompt' field, which --eval-input-key (default: --input-key) names" in message
    assert "line 1, line 2, line 3" in message and "'question', 'answer'" in message
    message = _errors(eval_prompt_data=data, eval_input_key="question")
    assert "no 'label' field, which --eval-label-key (default: --label-key)" in message
    message = _errors(eval_prompt_data=data, eval_input_key="question", eval_label_key="answer",
                      eval_metadata_key="info")
    assert "no 'info' field, which --eval-metadata-key names" in message
    # the right keys: accepted, and the prompts are the file's, in order
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), eval_prompt_data=data,
                       eval_input_key="question", eval_label_key="answer")
    assert validate(config, GRPO) == []
    prompts = build_eval_prompts(config, get_task("addition").make_tokenizer())
    assert [(p.text, p.label) for p in prompts] == [("<bos>1+2=", 3)] * 3
    # --eval-metadata-key: the records' own field reaches the reward function as the metadata
    data = _write(tmp_path / "meta.jsonl", [{"q": "<bos>2+2=", "a": 4, "info": {"source": "s", "id": i}} for i in range(2)])
    config = attrs.evolve(config, eval_prompt_data=data, eval_input_key="q", eval_label_key="a", eval_metadata_key="info")
    assert validate(config, GRPO) == []
    prompts = build_eval_prompts(config, get_task("addition").make_tokenizer())
    assert [p.metadata for p in prompts] == [{"source": "s", "id": 0}, {"source": "s", "id": 1}]


def test_flags_without_an_evaluation_set_warn(tmp_path):
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), evaluate=False, eval_interval=5,
                       eval_before_train=False)
    warnings = validate(config, GRPO)
    assert "--eval-interval has no effect: --no-eval" in warnings
    assert "--no-eval-before-train has no effect: --no-eval" in warnings
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), eval_n_samples_per_prompt=4)
    assert any("gives identical samples" in w for w in validate(config, GRPO))


def _cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "relax", "train", "--dry-run", *argv], check=False, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_relax_train_refuses_bad_evaluation_flags_before_starting(tmp_path):
    bad = _write(tmp_path / "eval.jsonl", [{"q": "<bos>1+2=", "a": 3}, {"q": "<bos>%%", "a": 1}])
    proc = _cli("--eval-interval", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--eval-interval" in proc.stderr
    proc = _cli("--eval-prompt-data", bad, cwd=tmp_path)
    assert proc.returncode == 2 and "no 'prompt' field, which --eval-input-key" in proc.stderr
    # keys right, but row 2 does not tokenize: pre-flight names the file, the row and the flag
    proc = _cli("--eval-prompt-data", bad, "--eval-input-key", "q", "--eval-label-key", "a", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"--eval-prompt-data {bad}: 1 bad line" in proc.stderr and "line 2" in proc.stderr


# -- one worker's slice ---------------------------------------------------------------------------


def _core(index=0, workers=1, **fields):
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), rollout_num_workers=workers, **fields)
    task = get_task("addition")
    engine = task.make_engine()
    prompts = held_out_problems()
    fn, keys = reward_setup(config)
    return SimpleNamespace(config=config, reward_keys=keys, reward_fn=fn, engine=engine,
                           tokenizer=engine.tokenizer, index=index, num_workers=workers,
                           eval_prompts=lambda: prompts)


def test_a_worker_scores_its_slice_with_the_evaluation_sampling_parameters():
    greedy = sample_eval_slice(_core(), version=0)
    task = get_task("addition")
    # an independent reference: the task's own greedy scorer on the same problems and weights
    reference = greedy_accuracy(task.make_engine(), task, held_out_problems())
    assert greedy["prompts"] == 20 and float(greedy["rewards"][:, 0].mean()) == pytest.approx(reference)
    halves = [sample_eval_slice(_core(i, 2), version=0) for i in (0, 1)]
    assert [h["prompts"] for h in halves] == [10, 10]
    assert torch.equal(torch.cat([h["rewards"] for h in halves]), greedy["rewards"])
    # nucleus sampling with a tiny top-p keeps only the most likely token: greedy again
    nucleus = sample_eval_slice(_core(eval_temperature=1.0, eval_top_p=1e-6), version=0)
    assert torch.equal(nucleus["rewards"], greedy["rewards"]) and nucleus["lengths"] == greedy["lengths"]
    short = sample_eval_slice(_core(eval_max_response_len=2), version=0)
    assert max(short["lengths"]) <= 2 < max(greedy["lengths"])
    # temperature 1: samples differ between versions (their own generators), reproducibly
    a, b = (sample_eval_slice(_core(eval_temperature=1.0, eval_n_samples_per_prompt=4), version=v) for v in (1, 2))
    again = sample_eval_slice(_core(eval_temperature=1.0, eval_n_samples_per_prompt=4), version=1)
    assert a["rewards"].shape == (80, 4) and torch.equal(a["rewards"], again["rewards"])
    assert not torch.equal(a["rewards"], b["rewards"])


def test_evaluating_never_touches_the_global_random_state():
    core = _core(eval_temperature=1.0, eval_n_samples_per_prompt=2)  # building the engine draws; evaluating must not
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    sample_eval_slice(core, version=5)
    assert torch.equal(torch.rand(4), expected)


# -- through run(), on the session's Ray cluster ---------------------------------------------------


def _config(out, **kw) -> RunConfig:
    base = {
        "algorithm": AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4),
        "rollout_batch_size": 4, "num_steps_per_rollout": 2, "num_rollout": 4, "seed": 5,
        "output_dir": str(out), "progress": False,
    }
    return RunConfig(**{**base, **kw})


TRAINING_PREFIXES = ("reward/", "multi_reward/", "actor/", "advantage/", "rollout/groups", "rollout/response_len",
                     "rollout/generated_tokens", "rollout/truncated_frac", "rollout/sampling_rounds", "async/")


def _training(row):
    return {k: v for k, v in row.items() if k.startswith(TRAINING_PREFIXES) and k != "rollout/tokens_per_s"}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_embedded_default_evaluates_before_every_interval_and_after_with_two_workers(ray_cluster, tmp_path):
    from relax.runtime.driver.train import run

    out = tmp_path / "run"
    # --eval-top-p through run(): at temperature 1, a nucleus this small keeps only the most likely
    # token, so the evaluation is the greedy one the reference below computes
    summary = run(_config(out, rollout_num_workers=2, eval_interval=3, num_rollout=4, log_completions=30,
                          eval_temperature=1.0, eval_top_p=1e-6))
    rows = metrics_rows(out)
    evaluated = {r["step"]: r for r in rows if "eval/num_prompts" in r}
    assert sorted(evaluated) == [0, 3, 4]  # before training, every 3 steps, after the last
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    task = get_task("addition")
    before = greedy_accuracy(task.make_engine(), task, held_out_problems())
    for step, row in evaluated.items():
        assert row["eval/policy_version"] == step and row["eval/num_prompts"] == 20
        assert row["eval/pass@1"] == row["eval/correct/mean"]  # one greedy sample: pass@1 is accuracy
        assert set(KEYS) <= {k.split("/")[1] for k in row if k.endswith("/mean") and k.startswith("eval/")}
    assert evaluated[0]["eval/correct/mean"] == pytest.approx(before)
    assert summary.eval_before == {k: v for k, v in evaluated[0].items() if k.startswith("eval/")}
    assert summary.eval_after["eval/policy_version"] == 4
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    evals = [s for s in samples if s["split"] == "eval"]
    assert sorted({s["step"] for s in evals}) == [0, 3, 4]
    step0 = [s for s in evals if s["step"] == 0]
    assert len(step0) == 20 and [s["prompt"] for s in step0] == [p.text for p in held_out_problems()]
    assert sum(s["rewards"]["correct"] for s in step0) / 20 == pytest.approx(evaluated[0]["eval/correct/mean"])
    assert {s["split"] for s in samples} == {"train", "eval"}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_evaluation_does_not_change_asynchronous_training(ray_cluster, tmp_path):
    from relax.runtime.driver.train import run

    common = {"fully_async": True, "max_staleness": 1, "rollout_num_workers": 2, "save_interval": 4}
    with_eval = run(_config(tmp_path / "eval", eval_interval=1, **common))
    without = run(_config(tmp_path / "plain", evaluate=False, **common))
    rows, plain = metrics_rows(tmp_path / "eval"), metrics_rows(tmp_path / "plain")
    assert [r["step"] for r in plain] == [1, 2, 3, 4] and not any("eval/pass@1" in r for r in plain)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [_training(r) for r in rows[1:]] == [_training(r) for r in plain]
    assert_same_weights(checkpoint_weights(tmp_path / "eval", 4), checkpoint_weights(tmp_path / "plain", 4))
    # every evaluation reports the version it measured: the weights of the step it is logged at
    assert [r["eval/policy_version"] for r in rows] == [0, 1, 2, 3, 4]
    assert without.eval_before is None and with_eval.eval_after["eval/policy_version"] == 4


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_evaluation_file_with_its_own_keys_gives_pass_at_k(ray_cluster, tmp_path):
    from relax.runtime.driver.train import run

    problems = [(1, 2), (4, 4), (7, 5), (9, 9), (0, 3)]
    data = _write(tmp_path / "eval.jsonl", [{"question": f"<bos>{a}+{b}=", "answer": a + b} for a, b in problems])
    out = tmp_path / "run"
    run(_config(out, num_rollout=2, eval_prompt_data=data, eval_input_key="question", eval_label_key="answer",
                eval_n_samples_per_prompt=4, eval_temperature=1.0, eval_before_train=False,
                eval_max_response_len=6, log_completions=20))
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2] and "eval/pass@4" not in rows[0]  # no step 0, no interval
    row = rows[1]
    assert row["eval/num_prompts"] == 5 and row["eval/policy_version"] == 2
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    evals = [s for s in samples if s["split"] == "eval" and s["step"] == 2]
    assert len(evals) == 20 and [s["prompt"] for s in evals[::4]] == [f"<bos>{a}+{b}=" for a, b in problems]
    assert all(s["label"] == a + b for s, (a, b) in zip(evals[::4], problems))
    counts = [sum(s["rewards"]["correct"] == 1.0 for s in evals[4 * i: 4 * i + 4]) for i in range(5)]
    assert row["eval/pass@4"] == pytest.approx(sum(pass_at_k(4, c, 4) for c in counts) / 5)
    assert row["eval/pass@1"] == pytest.approx(sum(c / 4 for c in counts) / 5)
    assert row["eval/response_len"] <= 6


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hugging_face_run_evaluates_a_file_with_a_custom_reward_and_pass_threshold(ray_cluster, tmp_path,
                                                                                    monkeypatch):
    """--hf-checkpoint + --prompt-data + --custom-rm-path: no evaluation unless --eval-prompt-data;
    with it, the HF engine samples the evaluation and pass@k counts the samples whose pass component
    (the first reward key, 'digits') reaches --eval-pass-threshold."""
    import shutil
    from pathlib import Path

    from relax.models.hf.tiny_random import build_tiny_random_checkpoint
    from relax.runtime.driver.train import run

    shutil.copy(Path(__file__).parents[1] / "hf" / "toy_reward.py", ray_cluster / "toy_reward.py")
    monkeypatch.chdir(ray_cluster)
    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny-qwen3", "qwen3")
    train = _write(tmp_path / "train.jsonl", [{"q": f"What is {i} + 3?", "a": i + 3} for i in range(8)])
    evals = _write(tmp_path / "eval.jsonl", [{"text": f"Add {i} and {i}.", "gold": 2 * i} for i in range(6)])
    out = tmp_path / "run"
    summary = run(RunConfig(
        advantage_estimator="gdpo", algorithm=AlgorithmConfig(reward_keys=("digits", "stops"), n_samples_per_prompt=4),
        hf_checkpoint=str(ckpt), prompt_data=train, input_key="q", label_key="a", custom_rm_path="toy_reward:reward",
        eval_prompt_data=evals, eval_input_key="text", eval_label_key="gold", eval_n_samples_per_prompt=3,
        eval_temperature=1.0, eval_pass_threshold=0.25, rollout_batch_size=4, num_steps_per_rollout=1,
        num_rollout=1, rollout_max_response_len=8, log_completions=18, output_dir=str(out), progress=False,
        rollout_num_workers=2,
    ))
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [0, 1] and [r["eval/num_prompts"] for r in rows] == [6, 6]
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    for row in rows:
        evals_ = [s for s in samples if s["split"] == "eval" and s["step"] == row["step"]]
        assert len(evals_) == 18 and [s["prompt"] for s in evals_[::3]] == [f"Add {i} and {i}." for i in range(6)]
        counts = [sum(s["rewards"]["digits"] >= 0.25 for s in evals_[3 * i: 3 * i + 3]) for i in range(6)]
        assert row["eval/pass@3"] == pytest.approx(sum(pass_at_k(3, c, 3) for c in counts) / 6)
        assert row["eval/pass@1"] == pytest.approx(sum(c / 3 for c in counts) / 6)
        assert row["eval/digits/mean"] == pytest.approx(sum(s["rewards"]["digits"] for s in evals_) / 18, rel=1e-6)
    assert summary.eval_before["eval/policy_version"] == 0 and summary.eval_after["eval/policy_version"] == 1
