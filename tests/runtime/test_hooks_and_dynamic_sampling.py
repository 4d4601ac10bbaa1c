"""The rollout hooks (``--custom-reward-post-process-path``, ``--dynamic-sampling-filter-path``), the
rewards-normalization switch, ``--reward-key`` and dynamic sampling with refill
(``--over-sampling-batch-size`` / ``--max-sampling-rounds``): unit checks on ``RolloutCore`` (no Ray),
then two tiny ``relax train`` runs on the session's shared cluster. docs/en/hooks.md is the contract.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from memory_plane import MemoryDataPlane

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.hooks import HookError
from relax.runtime.step.rollout_worker import RolloutCore
from relax.runtime.step.rollouts import rollout_metrics

KEYS = ("correct", "digits", "format", "length")

# The user's hooks. ``contract`` checks what every hook receives (it runs inside the rollout worker,
# so a violation stops the run).
HOOKS = '''
import torch

def contract(rewards, group_ids, samples):
    assert rewards.dtype == torch.float64 and rewards.dim() == 2, (rewards.dtype, rewards.shape)
    assert group_ids.dtype == torch.int64 and group_ids.shape == (rewards.shape[0],)
    assert isinstance(samples, list) and len(samples) == rewards.shape[0]
    for s in samples:
        assert set(s) == {"prompt", "completion", "label", "metadata"}, set(s)
        assert isinstance(s["prompt"], str) and isinstance(s["completion"], str)
        assert "sample_index" in s["metadata"]

def even_groups(rewards, group_ids, samples, keep):
    contract(rewards, group_ids, samples)
    assert keep.dtype == torch.bool and keep.shape == group_ids.shape
    return keep & (group_ids % 2 == 0)

def every_fourth_group(rewards, group_ids, samples, keep):
    contract(rewards, group_ids, samples)
    return group_ids % 4 == 0

def keep_all(rewards, group_ids, samples, keep):
    return torch.ones_like(keep)

def first_sample_only(rewards, group_ids, samples, keep):
    out = torch.zeros_like(keep)
    out[0] = True
    return out

def as_floats(rewards, group_ids, samples, keep):
    return keep.float()

def boom(rewards, group_ids, samples, keep):
    raise RuntimeError("filter service down")

def hangs(rewards, group_ids, samples, keep):
    import time
    time.sleep(3600)

def exits(rewards, group_ids, samples):
    raise SystemExit(2)

def plus_hundred(rewards, group_ids, samples):
    contract(rewards, group_ids, samples)
    weights = torch.arange(1, rewards.shape[1] + 1, dtype=torch.float64)
    return (rewards @ weights + 100.0).float()

def float64_out(rewards, group_ids, samples):
    return rewards.sum(1)

def short_out(rewards, group_ids, samples):
    return torch.zeros(1)

def nan_out(rewards, group_ids, samples):
    return torch.full((rewards.shape[0],), float("nan"))

def sample_index_reward(prompt, completion, label, metadata):
    return float(metadata["sample_index"])  # every group has signal
'''


class AppendingPlane(MemoryDataPlane):
    """The memory plane, but several writes to one step add groups (as TransferQueue does)."""

    def put_step(self, step, fields, group_uids):
        old = self.steps.get(step)
        count = super().put_step(step, fields, group_uids)
        if old is not None:
            new = self.steps[step]
            self.steps[step] = {"order": old["order"] + new["order"], "groups": {**old["groups"], **new["groups"]}}
        return count


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    (tmp_path / "my_relax_hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_relax_hooks"


def _config(algo="grpo", **kw) -> RunConfig:
    algorithm = kw.pop("algorithm", {})
    base = {
        "advantage_estimator": algo,
        "algorithm": AlgorithmConfig(**{"reward_keys": KEYS, "n_samples_per_prompt": 4, **algorithm}),
        "rollout_batch_size": 4,
        "num_steps_per_rollout": 2,
        "seed": 7,
    }
    base.update(kw)
    return RunConfig(**base)


# -- the hooks in the rollout worker ---------------------------------------------------------------


def test_filter_sees_the_algorithms_verdict_and_post_process_replaces_normalize_rewards(hooks):
    plane = AppendingPlane()
    core = RolloutCore(_config(dynamic_sampling_filter_path=f"{hooks}:even_groups",
                               custom_reward_post_process_path=f"{hooks}:plus_hundred"), "grpo", plane)
    out = core.step(1)
    gids = out["group_ids"]
    signal = core.algorithm.group_has_signal(out["raw_rewards"], gids)
    expected_groups = sorted({int(g) for g in gids[signal & (gids % 2 == 0)]})
    assert out["kept_uids"] == expected_groups
    if expected_groups:
        read = plane.read(1, ("rewards",), "check", len(expected_groups))
        by_hand = _kept_raw_rewards(out) @ torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64) + 100.0
        assert torch.equal(read["rewards"], by_hand.float())


def test_disable_rewards_normalization_trains_on_the_raw_weighted_sum():
    plane = AppendingPlane()
    weights = (1.0, 0.5, 0.25, 2.0)
    cfg = _config(algorithm={"rewards_normalization": False, "reward_weights": weights})
    out = RolloutCore(cfg, "grpo", plane).step(1)
    kept = out["kept_uids"]
    assert kept, "the fixed seed keeps some groups"
    read = plane.read(1, ("rewards",), "check", len(kept))
    r = _kept_raw_rewards(out)
    by_hand = (r[:, 0] * 1.0 + r[:, 1] * 0.5 + r[:, 2] * 0.25 + r[:, 3] * 2.0).float()
    assert torch.equal(read["rewards"], by_hand)
    normalized = RolloutCore(_config(algorithm={"reward_weights": weights}), "grpo", AppendingPlane())
    assert not torch.equal(read["rewards"], normalized.algorithm.normalize_rewards(r, torch.tensor(kept).repeat_interleave(4)))


@pytest.mark.parametrize(("flag", "hook", "message"), [
    ("dynamic_sampling_filter_path", "first_sample_only",
     r"--dynamic-sampling-filter-path 'my_relax_hooks:first_sample_only' \(step 3\) kept only part of prompt group 0"),
    ("dynamic_sampling_filter_path", "as_floats",
     r"\(step 3\) returned a torch.float32 tensor of shape \(16,\); keep_filter.*must return a bool tensor of shape \(16,\)"),
    ("dynamic_sampling_filter_path", "boom",
     r"--dynamic-sampling-filter-path 'my_relax_hooks:boom' \(step 3\) raised RuntimeError: filter service down"),
    ("custom_reward_post_process_path", "float64_out",
     r"--custom-reward-post-process-path 'my_relax_hooks:float64_out' \(step 3\) returned a torch.float64 tensor"),
    ("custom_reward_post_process_path", "short_out", r"returned a torch.float32 tensor of shape \(1,\); .*shape \(16,\)"),
    ("custom_reward_post_process_path", "nan_out", r"\(step 3\) returned 16 non-finite value\(s\), the first at sample 0"),
])
def test_a_hook_outside_its_contract_stops_the_rollout_naming_the_hook_and_step(hooks, flag, hook, message):
    cfg = _config(**{flag: f"{hooks}:{hook}"})
    if flag == "custom_reward_post_process_path":  # every group kept, so the hook sees all 16 samples
        cfg = _config(**{flag: f"{hooks}:{hook}", "dynamic_sampling_filter_path": f"{hooks}:keep_all"})
    with pytest.raises(HookError, match=message):
        RolloutCore(cfg, "grpo", AppendingPlane()).step(3)


def test_a_hook_that_never_returns_or_exits_is_named_with_its_step_and_flag(hooks):
    import time

    start = time.monotonic()
    with pytest.raises(HookError, match=r"--dynamic-sampling-filter-path 'my_relax_hooks:hangs' \(step 3\) did "
                                        r"not return within --hook-timeout 0.5s"):
        RolloutCore(_config(dynamic_sampling_filter_path=f"{hooks}:hangs", hook_timeout=0.5), "grpo",
                    AppendingPlane()).step(3)
    assert time.monotonic() - start < 30
    cfg = _config(custom_reward_post_process_path=f"{hooks}:exits", dynamic_sampling_filter_path=f"{hooks}:keep_all")
    with pytest.raises(HookError, match=r"'my_relax_hooks:exits' \(step 3\) called sys.exit\(2\) \(SystemExit\)"):
        RolloutCore(cfg, "grpo", AppendingPlane()).step(3)


def test_run_in_process_ends_naming_a_hook_past_its_hook_timeout(hooks, tmp_path):
    # --hook-timeout through run() (the API relax train calls), on the quick in-process runtime.
    from relax.runtime.driver.train import run

    config = RunConfig(in_process=True, num_rollout=2, rollout_batch_size=4, progress=False, hook_timeout=1.0,
                       dynamic_sampling_filter_path=f"{hooks}:hangs", output_dir=str(tmp_path / "out"))
    with pytest.raises(Exception, match=r"'my_relax_hooks:hangs' \(step 1\) did not return within --hook-timeout 1s"):
        run(config)


# -- dynamic sampling with refill -----------------------------------------------------------------


def _steps(cfg, algo="grpo", workers=1, steps=1):
    cores = [RolloutCore(cfg, algo, AppendingPlane(), index=i) for i in range(workers)]
    return [[c.step(s) for c in cores] for s in range(1, steps + 1)], cores


def test_refill_draws_rounds_until_the_share_is_full_or_the_limit_and_keeps_uids_unique(hooks):
    # 2 workers, rounds of 4 prompts (2 per worker), a share of 2 groups per worker, at most 3 rounds.
    # The filter keeps uids divisible by 4; uid = (round x 2 + worker) x 2 + position:
    # worker 0 sees 0,1 | 4,5 | ... -> keeps 0 and 4 (2 rounds); worker 1 sees 2,3 | 6,7 | 10,11 -> keeps
    # nothing, stops at the limit (3 rounds). 2 + 3 rounds x 2 prompts = 10 groups sampled, 2 kept.
    cfg = _config(rollout_num_workers=2, over_sampling_batch_size=4, max_sampling_rounds=3,
                  custom_rm_path=f"{hooks}:sample_index_reward", algorithm={"reward_keys": ("reward",)},
                  dynamic_sampling_filter_path=f"{hooks}:every_fourth_group")
    [rolls], cores = _steps(cfg, workers=2)
    assert [r["sampling_rounds"] for r in rolls] == [2, 3]
    assert [r["kept_uids"] for r in rolls] == [[0, 4], []]
    assert rolls[0]["group_ids"].unique().tolist() == [0, 1, 4, 5]
    assert rolls[1]["group_ids"].unique().tolist() == [2, 3, 6, 7, 10, 11]
    m = rollout_metrics(cores[0].algorithm, rolls)
    assert (m["rollout/sampling_rounds"], m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (3, 2, 8)
    # deterministic: the same configuration gives the same samples
    [again], _ = _steps(cfg, workers=2)
    for a, b in zip(rolls, again):
        assert a["kept_uids"] == b["kept_uids"] and torch.equal(a["raw_rewards"], b["raw_rewards"])


def test_over_sampling_keeps_the_first_groups_with_signal_and_drops_the_surplus(hooks):
    # 8 prompts per round, a batch of 4, every group has signal: the first 4 are trained.
    cfg = _config(over_sampling_batch_size=8, max_sampling_rounds=2, custom_rm_path=f"{hooks}:sample_index_reward",
                  algorithm={"reward_keys": ("reward",)})
    [[out]], cores = _steps(cfg)
    assert out["sampling_rounds"] == 1 and out["kept_uids"] == [0, 1, 2, 3]
    m = rollout_metrics(cores[0].algorithm, [out])
    assert (m["rollout/groups_kept"], m["rollout/groups_dropped"]) == (4, 4)


def test_default_is_one_round_and_unchanged(hooks):
    [[out]], cores = _steps(_config())
    assert out["sampling_rounds"] == 1 and out["group_ids"].unique().tolist() == [0, 1, 2, 3]
    assert rollout_metrics(cores[0].algorithm, [out])["rollout/sampling_rounds"] == 1


# -- the reward-side KL estimator ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_reward_side_kl_uses_kl_loss_type(kind):
    from relax.runtime.step.actor_worker import ActorCore

    old = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[True, True, False]])
    me = SimpleNamespace(config=_config(algorithm={"kl_loss_type": kind}))
    got = ActorCore._kl(me, {"old_log_probs": old, "ref_log_probs": ref, "batch": SimpleNamespace(response_mask=mask)})
    d = [0.5, -1.0]  # old - ref on the two valid tokens
    by_hand = {"k1": d, "k2": [0.125, 0.5], "k3": [torch.expm1(torch.tensor(-x)).item() + x for x in d]}
    by_hand["low_var_kl"] = by_hand["k3"]
    assert got[0, :2].tolist() == pytest.approx(by_hand[kind], rel=1e-6) and got[0, 2] == 0


# -- through `relax train` -------------------------------------------------------------------------


def _rows(out) -> list[dict]:
    """The training steps' rows (the embedded default also logs its evaluation before training, step 0)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["step"] > 0]


def _samples(out) -> list[dict]:
    """The training samples of completions.jsonl (the evaluation's are marked split "eval")."""
    lines = (out / "completions.jsonl").read_text().splitlines()
    return [x for x in map(json.loads, lines) if x["split"] == "train"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_runs_both_hooks_and_shows_the_reward_key(ray_cluster, tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    (ray_cluster / "my_relax_hooks.py").write_text(HOOKS)
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "hooks"
    argv = ["train", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--seed", "5", "--output-dir", str(out), "--no-progress", "--log-interval", "1",
            "--log-completions", "16", "--reward-key", "format",
            "--dynamic-sampling-filter-path", "my_relax_hooks:even_groups",
            "--custom-reward-post-process-path", "my_relax_hooks:plus_hundred"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    rows = _rows(out)
    assert [r["rollout/groups_kept"] + r["rollout/groups_dropped"] for r in rows] == [4, 4]
    assert all(r["rollout/groups_kept"] <= 2 for r in rows)  # odd groups are filtered out
    samples = _samples(out)
    assert len(samples) == 32
    trained = 0
    for i, x in enumerate(samples):
        group = (i % 16) // 4
        if group % 2:
            assert x["normalized_reward"] is None, "the filter drops odd groups"
        elif x["normalized_reward"] is not None:  # the post-process hook's value, not GRPO's
            by_hand = sum((j + 1) * x["rewards"][k] for j, k in enumerate(KEYS)) + 100.0
            assert x["normalized_reward"] == pytest.approx(by_hand, rel=1e-6)
            trained += 1
    assert trained == 4 * sum(r["rollout/groups_kept"] for r in rows) > 0
    lines = [line for line in err.splitlines() if line.startswith("relax: step ")]
    assert len(lines) == 2 and all(" | reward (format) " in line for line in lines)
    assert "format *" in err and "the run's reward (--reward-key format)" in err


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_refills_with_two_workers_and_fully_async(ray_cluster, tmp_path, monkeypatch):
    from relax.cli.main import main

    (ray_cluster / "my_relax_hooks.py").write_text(HOOKS)
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "refill"
    argv = ["train", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--seed", "5", "--output-dir", str(out), "--no-progress", "--rollout-num-workers", "2",
            "--fully-async", "--over-sampling-batch-size", "4", "--max-sampling-rounds", "3",
            "--disable-rewards-normalization", "--log-completions", "16",
            "--custom-rm-path", "my_relax_hooks:sample_index_reward",
            "--dynamic-sampling-filter-path", "my_relax_hooks:every_fourth_group"]
    assert main(argv) == 0
    rows = _rows(out)
    # Step 1: as in the unit test above (worker 0 fills its share in 2 rounds, worker 1 stops at 3).
    # Step 2 draws the same uids: group uids restart every step.
    assert [(r["rollout/sampling_rounds"], r["rollout/groups_kept"], r["rollout/groups_dropped"]) for r in rows] == [
        (3, 2, 8), (3, 2, 8)]
    assert all(r.get("train/skipped", 0) == 0 for r in rows)
    # --disable-rewards-normalization: the trained scalar is the raw reward (0, 1, 2, 3 by sample index),
    # not GRPO's group-normalized one
    samples = _samples(out)
    trained = [x for x in samples if x["normalized_reward"] is not None]
    assert trained and all(x["normalized_reward"] == x["rewards"]["reward"] for x in trained)
    assert sorted({x["normalized_reward"] for x in trained}) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_stops_naming_a_hook_that_breaks_its_contract(ray_cluster, tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    (ray_cluster / "my_relax_hooks.py").write_text(HOOKS)
    monkeypatch.chdir(ray_cluster)
    argv = ["train", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--output-dir", str(tmp_path / "broken"), "--no-progress",
            "--dynamic-sampling-filter-path", "my_relax_hooks:first_sample_only"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert ("--dynamic-sampling-filter-path 'my_relax_hooks:first_sample_only' (step 1) kept only part of "
            "prompt group 0") in err


def _kept_raw_rewards(out: dict) -> torch.Tensor:
    """The raw ``[n, K]`` rewards of the kept samples, in the order the data plane holds them."""
    return out["raw_rewards"][torch.isin(out["group_ids"], torch.tensor(out["kept_uids"], dtype=torch.long))]
