"""The runtime's parts that run without Ray: sampler, data-plane helpers, step plan, group filter,
metrics, and the rollout / advantages / actor logic on an in-memory data plane."""

from __future__ import annotations

import json

import pytest
import torch
from memory_plane import MemoryDataPlane

import relax.backends.megatron.rules as megatron_pkg
from relax.algorithms import AlgorithmConfig, get_algorithm
from relax.config.run import RunConfig
from relax.runtime.data.data_plane import _densify, group_rows
from relax.runtime.data.sampler import GROUP_SIZE, GROUP_UID, SAMPLE_INDEX, PromptGroupSampler, select_groups
from relax.runtime.files.metrics_log import MetricsLog, summary_table
from relax.runtime.metrics.step_metrics import reward_metrics
from relax.runtime.step.actor_worker import ActorCore
from relax.runtime.step.advantages import AdvantagesCore
from relax.runtime.step.rollout_worker import RolloutCore, filter_groups
from relax.runtime.step.rollouts import rollout_metrics
from relax.runtime.step.schedule import plan_step

KEYS = ("correct", "digits", "format", "length")


# -- sampler -------------------------------------------------------------------------------------


def _meta(uid_of: dict[int, int], size: int) -> dict[int, dict]:
    # written in index order: the write position of index i is i
    return {index: {GROUP_UID: uid, GROUP_SIZE: size, SAMPLE_INDEX: index} for index, uid in uid_of.items()}


def test_select_groups_returns_requested_groups_whole_and_in_request_order():
    # indexes 10..17: groups 7 (10, 13), 3 (11, 12), 5 (14, 15); index 16 belongs to group 9 whose
    # second sample is not ready.
    meta = _meta({10: 7, 11: 3, 12: 3, 13: 7, 14: 5, 15: 5, 16: 9}, size=2)
    ready = [10, 11, 12, 13, 14, 15, 16]
    assert select_groups(ready, meta, [5, 7]) == ([14, 15, 10, 13], [])
    assert select_groups(ready, meta, [3, 9]) == ([], [9])  # all or nothing
    assert select_groups(ready, meta, None) == ([10, 13, 11, 12, 14, 15], [])  # complete ones, write order


def test_prompt_group_sampler_reads_custom_meta_of_the_partition():
    class Partition:
        def get_custom_meta(self, indexes):
            table = _meta({0: 2, 1: 2, 2: 0, 3: 0}, size=2)
            return {i: table[i] for i in indexes if i in table}

    sampler = PromptGroupSampler()
    sampled, consumed = sampler.sample([0, 1, 2, 3], 2, partition=Partition(), group_uids=[2])
    assert sampled == consumed == [0, 1]
    assert sampler.sample([0, 2, 3], 2, partition=Partition(), group_uids=[2]) == ([], [])


# -- data-plane helpers --------------------------------------------------------------------------


def test_group_rows_keeps_each_groups_completions_in_order():
    uids, order = group_rows(torch.tensor([4, 1, 4, 1, 9, 9]))
    assert uids == [4, 1, 9]
    assert order.tolist() == [[0, 2], [1, 3], [4, 5]]
    with pytest.raises(ValueError, match="same size"):
        group_rows(torch.tensor([0, 0, 1]))


def test_densify_turns_a_jagged_nested_tensor_of_uniform_rows_back_into_the_dense_tensor():
    dense = torch.arange(24, dtype=torch.float32).view(3, 2, 4)
    nested = torch.nested.as_nested_tensor(list(dense), layout=torch.jagged)
    out = _densify(nested, 3)
    assert not out.is_nested and torch.equal(out, dense)
    ragged = torch.nested.as_nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
    with pytest.raises(RuntimeError, match="different shapes"):
        _densify(ragged, 2)


# -- step plan -----------------------------------------------------------------------------------


def test_plan_step_splits_groups_into_minibatches_then_ranks():
    plan = plan_step([5, 1, 8, 2, 6], [3, 4, 5, 6, 7], group_size=4, num_minibatches=2, world_size=2)
    assert plan.minibatches == ((5, 1, 8), (2, 6))
    assert plan.shards == (((5, 1), (2,)), ((8,), (6,)))
    assert plan.segment_sizes == (12, 8)
    assert plan.global_tokens == (12, 13)
    assert plan.rank_uids(0) == [5, 1, 2] and plan.rank_segment_sizes(1) == (4, 4)
    few = plan_step([3], [2], group_size=4, num_minibatches=2, world_size=2)
    assert few.minibatches == ((3,),) and few.shards == (((3,),), ((),))
    assert few.rank_segment_sizes(1) == (0,)


# -- group filter through the algorithm ---------------------------------------------------------


def test_group_filter_asks_the_algorithm():
    # Weights (1, 2). Group 0: a = (2, 0), b = (0, 1): the weighted sum is 2 for both samples, so
    # GRPO sees no signal, but each component varies and GDPO's decoupled values differ
    # (0.707 - 1.414 vs -0.707 + 1.414). Group 1: everything constant -> nobody keeps it.
    # Group 2: varies -> everybody keeps it.
    rewards = torch.tensor(
        [[2.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64
    )
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    cfg = AlgorithmConfig(reward_keys=("a", "b"), reward_weights=(1.0, 2.0), n_samples_per_prompt=2)
    grpo = filter_groups(get_algorithm("grpo")(cfg), rewards, groups)
    gdpo = filter_groups(get_algorithm("gdpo")(cfg), rewards, groups)
    ppo = filter_groups(get_algorithm("ppo")(cfg), rewards, groups)
    assert grpo.tolist() == [False, False, False, False, True, True]
    assert gdpo.tolist() == [True, True, False, False, True, True]
    assert ppo.tolist() == [True] * 6  # no group baseline: a constant group still teaches the critic


def test_group_filter_rejects_an_algorithm_that_splits_a_group():
    class Splitter(get_algorithm("grpo")):
        name = "splitter_for_test"

        def group_has_signal(self, rewards, group_ids):
            return torch.tensor([True, False])

    with pytest.raises(ValueError, match="whole groups"):
        filter_groups(Splitter(AlgorithmConfig()), torch.ones(2, 1, dtype=torch.float64), torch.tensor([0, 0]))


# -- metrics -------------------------------------------------------------------------------------


def test_reward_metrics_by_hand():
    # Group 0: (2, 0) and (0, 1) with weights (1, 2) have equal weighted sums (GRPO sees nothing) but
    # GDPO's per-component z-scores still differ: a collapse. Group 1: component a is constant.
    algo = get_algorithm("gdpo")(AlgorithmConfig(reward_keys=("a", "b"), reward_weights=(1.0, 2.0),
                                                 n_samples_per_prompt=2))
    rewards = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.5]], dtype=torch.float64)
    s = reward_metrics(algo, rewards, torch.tensor([0, 0, 1, 1]), ("a", "b"))
    assert s["reward/a/mean"] == pytest.approx(1.0)
    assert s["reward/a/std"] == pytest.approx(0.5 ** 0.5)  # population std
    assert s["reward/b/mean"] == pytest.approx(0.625)
    assert s["reward/a/zero_std_frac"] == 0.5 and s["reward/b/zero_std_frac"] == 0.0
    assert s["multi_reward/collapse_rate"] == 0.5 and s["multi_reward/gdpo_cancel_rate"] == 0.0
    # |w z| per sample: a = 1/sqrt(2) in group 0 only; b = 2/sqrt(2) everywhere -> share 1/5 vs 4/5
    assert s["gdpo/a/adv_share"] == pytest.approx(0.2, rel=1e-3)
    assert s["gdpo/b/adv_share"] == pytest.approx(0.8, rel=1e-3)
    assert not any(k.startswith("advantage/") for k in s)  # the rollout has no advantages yet


def test_metrics_log_resume_drops_steps_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in range(1, 6):
        log.write({"step": step, "reward/a/mean": float(step)})
    resumed = MetricsLog(path, resume_after_step=3)
    assert [r["step"] for r in resumed.rows] == [1, 2, 3]
    resumed.write({"step": 4, "reward/a/mean": 40.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]
    table, stats = summary_table(resumed.rows, ("a",))
    assert stats["a"] == (1.0, 40.0) and "a" in table


# -- roles on an in-memory data plane ------------------------------------------------------------


def _run_config(algo: str, **kw) -> RunConfig:
    base = {
        "advantage_estimator": algo,
        "algorithm": AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4),
        "rollout_batch_size": 6,
        "num_steps_per_rollout": 2,
        "seed": 7,
    }
    base.update(kw)
    return RunConfig(**base)


def test_rollout_writes_only_kept_groups_with_the_algorithms_normalized_rewards():
    cfg = _run_config("gdpo")
    plane = MemoryDataPlane()
    rollout = RolloutCore(cfg, "gdpo", plane)
    out = rollout.step(1)
    kept = out["kept_uids"]
    m = rollout_metrics(rollout.algorithm, [out])
    assert m["rollout/groups_kept"] == len(kept) and m["rollout/groups_kept"] + m["rollout/groups_dropped"] == 6
    for key in KEYS:
        assert {f"reward/{key}/mean", f"reward/{key}/std", f"reward/{key}/zero_std_frac"} <= set(m)
    if kept:
        read = plane.read(1, ("rewards", "response_mask"), "check", len(kept))
        gids = torch.tensor(kept).repeat_interleave(4)
        raw = _kept_raw_rewards(out)
        expected = rollout.algorithm.normalize_rewards(raw, gids)
        assert torch.equal(read["rewards"], expected)
        assert raw.dtype == torch.float64 and raw.shape == (4 * len(kept), 4)
        assert out["group_tokens"] == read["response_mask"].sum(1).view(-1, 4).sum(1).tolist()


def test_rollout_state_resumes_the_same_prompt_stream_and_sampling():
    cfg = _run_config("grpo")
    a = RolloutCore(cfg, "grpo", MemoryDataPlane())
    a.step(1)
    state = a.state_dict()
    expected = a.step(2)
    b = RolloutCore(cfg, "grpo", MemoryDataPlane())
    b.load_state_dict(state)
    got = b.step(2)
    assert got["kept_uids"] == expected["kept_uids"]
    correct = [rollout_metrics(a.algorithm, [r])["reward/correct/mean"] for r in (got, expected)]
    assert correct[0] == correct[1]
    assert got["group_tokens"] == expected["group_tokens"]


def _one_training_step(cfg, algo, *, on_actor: bool):
    plane = MemoryDataPlane()
    out = RolloutCore(cfg, algo, plane).step(1)
    plan = plan_step(out["kept_uids"], out["group_tokens"], 4, 2, 1)
    assert plan.num_groups >= 2, "the fixed seed should keep at least two groups"
    if not on_actor:
        AdvantagesCore(algo, cfg.algorithm, plane).compute(1, plan.num_groups, plan.segment_sizes, False, False)
    actor = ActorCore(cfg, algo, with_reference=False, advantages_on_actor=on_actor, data_plane=plane)
    metrics, weights = actor.train(1, plan)
    return metrics, weights, plane, plan


def test_advantages_placement_serve_or_actor_gives_identical_weights():
    cfg = _run_config("gdpo")
    m_serve, w_serve, *_ = _one_training_step(cfg, "gdpo", on_actor=False)
    m_actor, w_actor, *_ = _one_training_step(cfg, "gdpo", on_actor=True)
    assert m_serve["actor/loss"] == m_actor["actor/loss"]
    for k in w_serve:
        assert torch.equal(w_serve[k], w_actor[k]), k


def test_micro_batching_reproduces_the_whole_minibatch_loss_and_gradient():
    # Global token normalization: the micro-batch losses sum to the whole mini-batch loss, and the
    # accumulated gradient has the same (pre-clip) norm. Normalizing each micro-batch by its own
    # token count would change both by far more than float rounding.
    whole = _one_training_step(_run_config("grpo"), "grpo", on_actor=False)[0]
    micro = _one_training_step(_run_config("grpo", micro_batch_size=3), "grpo", on_actor=False)[0]
    assert whole["actor/grad_norm"] > 0
    assert micro["actor/loss"] == pytest.approx(whole["actor/loss"], rel=1e-5, abs=1e-7)
    assert micro["actor/grad_norm"] == pytest.approx(whole["actor/grad_norm"], rel=1e-5)


def test_gdpo_advantages_are_whitened_per_minibatch_segment():
    cfg = _run_config("gdpo")
    _, _, plane, plan = _one_training_step(cfg, "gdpo", on_actor=False)
    read = plane.read(1, ("rewards", "response_mask", "advantages"), "check", plan.num_groups)
    adv, mask, rewards = read["advantages"], read["response_mask"], read["rewards"].double()
    start = 0
    for size in plan.segment_sizes:
        seg = rewards[start:start + size]
        expected = (seg - seg.mean()) / (seg.std() + 1e-4)  # GDPO step 3, by hand
        first_token = adv[start:start + size, 0]
        assert mask[start:start + size, 0].all()
        torch.testing.assert_close(first_token.double(), expected, rtol=1e-5, atol=1e-5)
        start += size


# -- backend choice: checkpoints, validation, GPU requests ----------------------------------------


def _state_of(backend: str) -> dict:
    actor = {"model": {}, "optimizer": {}, "step": 0} if backend == "torch" else {"format": "relax-megatron-v1"}
    return {"step": 4, "advantage_estimator": "gdpo", "critic": None, "actor": {"backend": actor},
            "rollout": {"prompts": {}, "generator": None}}


def test_a_checkpoint_of_the_other_backend_is_refused_naming_the_flags():
    from relax.backends.registry import checkpoint_backend
    from relax.runtime.files.checkpoint_files import check_checkpoint

    megatron = RunConfig(advantage_estimator="gdpo", backend="megatron")
    assert checkpoint_backend(_state_of("torch")) == "torch"  # older checkpoints: by their layout
    assert checkpoint_backend({**_state_of("torch"), "backend": "megatron"}) == "megatron"
    with pytest.raises(ValueError, match=r"--load run1: .*--backend torch, this run uses --backend megatron"):
        check_checkpoint(megatron, _state_of("torch"), "run1", has_critic=False)
    check_checkpoint(megatron, _state_of("megatron"), "run1", has_critic=False)
    with pytest.raises(ValueError, match="--backend megatron, this run uses --backend torch"):
        check_checkpoint(RunConfig(advantage_estimator="gdpo"), _state_of("megatron"), "run1", has_critic=False)
    with pytest.raises(ValueError, match="disagree on whether a critic exists"):
        check_checkpoint(megatron, _state_of("megatron"), "run1", has_critic=True)


def test_hf_checkpoint_with_megatron_is_a_configuration_error(monkeypatch, tmp_path):
    from relax.runtime.checks import validation

    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: True)
    algo = get_algorithm("gdpo")
    base = {"advantage_estimator": "gdpo", "algorithm": AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4)}
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')  # an architecture it does not convert
    with pytest.raises(validation.ConfigError, match=r"\(model_type 'gpt2'\) with --backend megatron: the Megatron "
                       r"backend converts llama, qwen2, qwen3 \(dense\) checkpoints only"):
        validation.validate(RunConfig(**base, backend="megatron", hf_checkpoint=str(tmp_path)), algo)
    with pytest.raises(validation.ConfigError, match=r"--actor-num-workers 3 must be a multiple of .*"
                       r"--pipeline-model-parallel-size 2 = 2"):
        validation.validate(RunConfig(**base, backend="megatron", actor_num_workers=3, pipeline_model_parallel_size=2), algo)
    validation.validate(RunConfig(**base, backend="megatron", actor_num_workers=4, tensor_model_parallel_size=2), algo)


def test_gpu_requests():
    from relax.runtime.cluster.cluster import gpu_requests

    assert gpu_requests(0, 1) == (0.0, 0.0)
    assert gpu_requests(1, 1) == (0.5, 0.5)  # one actor rank shares the GPU with the rollout
    assert gpu_requests(3, 2) == (1.0, 1.0)
    assert gpu_requests(2, 2) == (0.0, 0.0)  # two NCCL ranks must not share a GPU
    assert gpu_requests(3, 1, rollout_workers=2) == (1.0, 1.0)
    assert gpu_requests(1, 1, rollout_workers=2) == (0.0, 0.0)  # no half GPU for three processes
    # a reward model without --reward-model-gpus on the shared GPU: a third each, the third left free
    assert gpu_requests(1, 1, service_replicas=1) == (0.3333, 0.3333)
    assert gpu_requests(1, 1, service_replicas=2) == (0.25, 0.25)
    assert gpu_requests(2, 1, service_replicas=1) == (1.0, 1.0)  # the services share what is left: none


def test_densify_pads_rows_of_different_widths_on_the_fields_side():
    """Several rollout workers pad a step's fields to their own widths: prompts stay left-aligned
    to the response, per-token response fields start at column 0."""
    a, b = torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5, 6, 7], [8, 9, 10]])
    mixed = torch.nested.as_nested_tensor([a, b])
    assert _densify(mixed, 2, "response_ids").tolist() == [[[1, 2, 0], [3, 4, 0]], [[5, 6, 7], [8, 9, 10]]]
    assert _densify(mixed, 2, "prompt_ids").tolist() == [[[0, 1, 2], [0, 3, 4]], [[5, 6, 7], [8, 9, 10]]]
    masks = torch.nested.as_nested_tensor([torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool)])
    assert _densify(masks, 2, "response_mask").tolist() == [[[True, False]], [[True, True]]]


def _kept_raw_rewards(out: dict) -> torch.Tensor:
    """The raw ``[n, K]`` rewards of the kept samples, in the order the data plane holds them."""
    return out["raw_rewards"][torch.isin(out["group_ids"], torch.tensor(out["kept_uids"], dtype=torch.long))]


def test_a_serve_that_cannot_be_imported_says_why(monkeypatch):
    """The H200 image's grpcio did not match grpcio-reflection: Serve's import failed inside the
    deployment thread, and the run said only "unknown error"."""
    import sys

    import ray

    from relax.runtime.cluster.cluster import Runtime

    runtime = Runtime.__new__(Runtime)  # only the deployment thread's body is under test
    runtime._serve_error = "unknown error"
    monkeypatch.delattr(ray, "serve", raising=False)
    monkeypatch.setitem(sys.modules, "ray.serve", None)  # "import ray.serve" raises ImportError
    runtime._deploy_advantages()
    assert runtime._serve_error.startswith("Ray Serve could not be imported (ModuleNotFoundError:")
    assert "--advantages-on-actor" in runtime._serve_error
