"""The rollout role: draw prompts, sample a group of completions per prompt, score them, drop the
groups that carry no signal for this algorithm, normalize the rewards, write the step to the data
plane. ``RolloutCore`` is plain Python (unit-testable); ``RolloutWorker`` is its Ray actor.

With ``--rollout-num-workers N`` there are N rollout workers. Every worker draws the step's whole
prompt batch from its own copy of the prompt stream and keeps its slice ``index`` of it, so the
step's prompts are the same whatever N is; each samples with its own seeded generator and writes
its groups (uids offset by its slice) into the same partition. ``relax.runtime.step.rollouts`` merges
their reports in worker order, so the plan and the metrics do not depend on which finished first.

One step of one worker (``RolloutCore.step``; docs/en/hooks.md):

1. **sampling rounds** (dynamic sampling): each round draws ``--over-sampling-batch-size`` prompts
   (default ``--rollout-batch-size``) and keeps its slice of them, generates, scores, and decides
   which groups to keep: the algorithm's ``group_has_signal``, then the
   ``--dynamic-sampling-filter-path`` hook ``keep_filter(rewards, group_ids, samples, keep)`` if one
   is given. Rounds go on until the worker holds its share (``--rollout-batch-size`` / N) of kept
   groups or ``--max-sampling-rounds`` rounds are done; kept groups beyond the share are dropped
   (first come, first kept). A worker's rounds depend only on its own samples, so refill stays
   deterministic; its prompt stream then runs ahead of the other workers' (each checkpoints its
   own). Group uids are ``(round x N + index) x slice + position``: unique within the step.
2. **reward stage**, once over all kept samples of the worker: the
   ``--custom-reward-post-process-path`` hook ``post_process(rewards, group_ids, samples)`` if one is
   given (it replaces the method's reward normalization), else with
   ``--disable-rewards-normalization`` the raw ``--reward-weights``-weighted sum of the components,
   else the algorithm's ``normalize_rewards``.
3. the kept samples go to the data plane (one write per round).
"""

from __future__ import annotations

import time

import torch

from relax.algorithms import load_algorithm, numerics
from relax.algorithms.types import check_normalized_rewards
from relax.rollout import factory as rollout_factory
from relax.rollout.base import SamplingParams
from relax.rollout.engines import carries_behaviour_log_probs
from relax.rollout.environments import episode_runner
from relax.rollout.hooks import FILTER_FLAG, POST_PROCESS_FLAG, call_keep_filter, call_post_process
from relax.rollout.reward_services import CombinedRewards
from relax.rollout.rewards import load_function
from relax.rollout.sampling import sample_groups
from relax.rollout.truncation import filter_overlong, truncated_rows
from relax.runtime.metrics.step_metrics import completion_records, gpu_peak_mib, response_stats
from relax.runtime.step.eval_sampling import sample_eval_slice
from relax.runtime.step.exit_guard import guard_os_exit
from relax.runtime.step.fields import ATTENTION_FIELD, AttachesDataPlane
from relax.runtime.step.rollouts import step_shape
from relax.runtime.weights.weight_sync import JoinsWeightGroup, WeightSync, make_weight_sync


def filter_groups(algorithm, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Boolean ``[N]``: keep the samples whose prompt group carries a learning signal, as the
    algorithm decides (``group_has_signal``). Whole groups only: a mixed answer is a bug."""
    keep = algorithm.group_has_signal(rewards, group_ids)
    if keep.dtype != torch.bool or keep.shape != group_ids.shape:
        raise TypeError(
            f"{type(algorithm).__name__}.group_has_signal must return a bool tensor of shape "
            f"{tuple(group_ids.shape)}, got {keep.dtype} {tuple(keep.shape)}"
        )
    for g in torch.unique(group_ids[keep]).tolist():
        if not bool(keep[group_ids == g].all()):
            raise ValueError(
                f"{type(algorithm).__name__}.group_has_signal kept only part of prompt group {g}; it must "
                "keep or drop whole groups"
            )
    return keep


class RolloutCore:
    def __init__(self, config, algorithm_spec: str, data_plane=None, index: int = 0,
                 weight_sync: WeightSync | None = None):
        torch.set_num_threads(1)
        guard_os_exit()  # a reward function, hook or environment calling os._exit() is named first
        self.config = config
        self.index, self.num_workers = index, config.rollout_num_workers
        self.algorithm = load_algorithm(algorithm_spec)(config.algorithm)
        self.engine = rollout_factory.build_engine(config)
        self.tokenizer = self.engine.tokenizer
        self.prompts = rollout_factory.build_prompt_source(config, self.tokenizer)
        self.reward_fn, self.reward_keys = rollout_factory.reward_setup(config)
        # Multi-turn episodes (--env-path, or a task with an environment); None: one completion each.
        self.episodes = episode_runner(config)
        # The user's hooks, loaded in this process (the CLI loaded them once already to fail early).
        self.post_process = (
            load_function(config.custom_reward_post_process_path, POST_PROCESS_FLAG)
            if config.custom_reward_post_process_path else None
        )
        self.keep_filter = (
            load_function(config.dynamic_sampling_filter_path, FILTER_FLAG)
            if config.dynamic_sampling_filter_path else None
        )
        # Dynamic sampling: prompts per round (this worker keeps its slice), the groups this worker
        # must collect, and the most rounds it may draw.
        self.round_prompts = config.over_sampling_batch_size or config.rollout_batch_size
        self.target_groups = config.rollout_batch_size // self.num_workers
        self.max_rounds = config.max_sampling_rounds
        # Worker 0 keeps the run's seed (one worker samples as before); the others are offset far
        # beyond any seed a user picks for another run.
        self.generator = torch.Generator().manual_seed(config.seed + index * 2**32)
        self.params = SamplingParams(
            temperature=config.rollout_temperature,
            top_p=config.rollout_top_p,
            max_new_tokens=config.rollout_max_response_len,
            top_k=config.rollout_top_k,
            min_p=config.rollout_min_p,
            stop=config.rollout_stop,
        )
        # Behaviour log-probs travel with the samples only when the loss corrects for staleness or the
        # trainer measures the engine's mismatch (relax.rollout.engines).
        self.write_rollout_log_probs = carries_behaviour_log_probs(config)
        self.write_policy_version = config.fully_async
        self.data_plane = data_plane
        self._last_end: float | None = None
        self._eval_prompts: list | None = None  # built on the first evaluation
        # the weight route's receiving side (relax.runtime.weights.weight_sync): the run's transport, handed in
        self.weight_sync = weight_sync if weight_sync is not None else make_weight_sync(config)

    def _my_prompts(self) -> list:
        per_worker = self.round_prompts // self.num_workers
        batch = self.prompts.next_batch(self.round_prompts)
        return batch[self.index * per_worker : (self.index + 1) * per_worker]

    def _sample_round(self, step: int, round_index: int, needed: int) -> dict:
        """One sampling round: this worker's slice of a fresh prompt batch, generated, scored and
        filtered; at most ``needed`` groups are kept (the first ones)."""
        prompts = self._my_prompts()
        scored = sample_groups(self.engine, prompts, self.config.algorithm.n_samples_per_prompt, self.params,
                               generator=self.generator, reward_fn=self.reward_fn, reward_keys=self.reward_keys,
                               concurrency=self.config.reward_concurrency,
                               episodes=self.episodes.at_step(step) if self.episodes is not None else None)
        rewards = scored.rewards
        # unique over the step's workers and rounds
        group_ids = scored.owner + (round_index * self.num_workers + self.index) * len(prompts)
        keep = filter_groups(self.algorithm, rewards, group_ids)
        samples = scored.samples()
        if self.keep_filter is not None:
            keep = call_keep_filter(self.keep_filter, self.config.dynamic_sampling_filter_path, step,
                                    rewards, group_ids, samples, keep, timeout=self.config.hook_timeout)
        kept_groups = torch.unique_consecutive(group_ids[keep])
        if kept_groups.numel() > needed:  # the share is full: later groups are not trained
            keep = keep & torch.isin(group_ids, kept_groups[:needed])
        return {
            "gen": scored.generation, "texts": scored.texts, "completions": scored.completions,
            "labels": scored.labels, "samples": samples, "rewards": rewards, "group_ids": group_ids, "keep": keep,
            "generate_s": scored.generate_s, "reward_s": scored.reward_s, "episode_stats": scored.episode_stats,
        }

    def _reward_stage(self, step: int, rewards: torch.Tensor, group_ids: torch.Tensor, samples: list) -> torch.Tensor:
        """One scalar per kept sample: the post-process hook, or the raw combined reward
        (``--disable-rewards-normalization``), or the algorithm's ``normalize_rewards``."""
        if group_ids.numel() == 0:
            return torch.zeros(0)
        if self.post_process is not None:
            return call_post_process(self.post_process, self.config.custom_reward_post_process_path, step,
                                     rewards, group_ids, samples, timeout=self.config.hook_timeout)
        a = self.config.algorithm
        if not a.rewards_normalization:
            return numerics.weighted_sum(numerics.reward_matrix(rewards, a.reward_keys), a.reward_weights).float()
        normalized = self.algorithm.normalize_rewards(rewards, group_ids)
        check_normalized_rewards(self.algorithm, normalized, group_ids.shape, step=step)
        return normalized

    # -- one training step --
    def step(self, step: int, version: int = 0, weights=None, *after) -> dict:
        """One rollout of this worker's slice with ``weights`` (a state dict, ``PackedWeights``, or
        None: keep the current ones), which are the policy after training step ``version``.
        ``after``: results of that training step's consumers (Ray resolves them before this runs, so
        the rollout never overtakes the training it depends on). The driver drops partitions."""
        t0 = time.perf_counter()
        idle = t0 - self._last_end if self._last_end is not None else 0.0
        if weights is not None:
            self.weight_sync.receive(weights, self.engine)
        self.weight_sync.forget_older(version)  # rollouts sample with ever newer versions
        n = self.config.algorithm.n_samples_per_prompt
        self._services_at(f"step {step}")
        rounds: list[dict] = []
        kept = 0
        while len(rounds) < self.max_rounds and kept < self.target_groups:
            r = self._sample_round(step, len(rounds), self.target_groups - kept)
            rounds.append(r)
            kept += int(r["keep"].sum()) // n
        t3 = time.perf_counter()

        def cat(key):
            return torch.cat([r[key] for r in rounds])

        rewards, group_ids, keep = cat("rewards"), cat("group_ids"), cat("keep")
        kept_ids = group_ids[keep]
        kept_samples = [s for r in rounds for s, k in zip(r["samples"], r["keep"].tolist()) if k]
        normalized = self._reward_stage(step, rewards[keep], kept_ids, kept_samples)
        kept_uids = torch.unique_consecutive(kept_ids).tolist()
        offset = 0
        tokens_per_group: list[int] = []
        # --overlong-filter: truncated responses leave the loss (counts per group, for the plan)
        sequences_per_group: list[int] = []
        filtered = 0
        trained_tokens = 0
        for r in rounds:  # one data-plane write per round (the rounds' tensors differ in width)
            k, batch = r["keep"], r["gen"].batch
            count = int(k.sum())
            if count == 0:
                continue
            loss_mask = batch.response_mask[k].bool()
            if self.config.overlong_filter:
                cut = truncated_rows(batch.response_ids[k], loss_mask, self.params.max_new_tokens,
                                     self.tokenizer.eos_id)
                loss_mask, filtered = filter_overlong(loss_mask, cut), filtered + int(cut.sum())
                sequences_per_group += loss_mask.any(1).view(-1, n).sum(1).tolist()
            tokens_per_group += loss_mask.sum(1).view(-1, n).sum(1).tolist()
            trained_tokens += int(batch.prompt_mask[k].sum()) + int(batch.response_mask[k].sum())
            if self.data_plane is not None:
                # Only what a role reads: every field costs a serialization per prompt group on each
                # put and get (masks as bool: 1 byte, not 8). The raw reward components stay in the
                # driver's report; the sampling log-probs travel only for an off-policy correction.
                fields = {
                    "prompt_ids": batch.prompt_ids[k],
                    "prompt_mask": batch.prompt_mask[k].bool(),
                    "response_ids": batch.response_ids[k],
                    "response_mask": loss_mask,
                    "rewards": normalized[offset : offset + count].float(),
                }
                if batch.response_attention_mask is not None:  # environment turns (relax.models.batch)
                    fields[ATTENTION_FIELD] = batch.response_attention_mask[k].bool()
                if self.write_rollout_log_probs:
                    fields["rollout_log_probs"] = r["gen"].log_probs[k].float()
                if self.write_policy_version:
                    fields["policy_version"] = torch.full((count,), version, dtype=torch.long)
                self.data_plane.put_step(step, fields, r["group_ids"][k])
            offset += count
        t4 = self._last_end = time.perf_counter()
        stats = [
            response_stats(r["gen"].batch.response_ids, r["gen"].batch.response_mask, self.params.max_new_tokens,
                           self.tokenizer.eos_id)
            for r in rounds
        ]
        texts = [t for r in rounds for t in r["texts"]]
        return {
            "kept_uids": kept_uids,
            "group_size": n,
            "group_tokens": tokens_per_group,
            **({"group_sequences": sequences_per_group, "overlong_filtered": filtered}
               if self.config.overlong_filter else {}),
            "version": version,
            "raw_rewards": rewards,
            "group_ids": group_ids,
            "samples": len(texts),
            "sampling_rounds": len(rounds),
            "episode_stats": [r["episode_stats"] for r in rounds if r["episode_stats"]],  # multi-turn
            # --reward-model-path / --judge-model-path: batch sizes and waiting (relax.runtime.cluster.reward_services)
            "reward_services": self.reward_fn.take_stats() if isinstance(self.reward_fn, CombinedRewards) else {},
            "generated_tokens": sum(int(r["gen"].batch.response_mask.sum()) for r in rounds),
            "trained_tokens": trained_tokens,  # prompt and response tokens written for training
            **gpu_peak_mib("gpu_peak_mib"),
            # response_len_max, truncated (relax.runtime.metrics.step_metrics.response_metrics merges them)
            "response_len_max": max(s["response_len_max"] for s in stats),
            "truncated": sum(s["truncated"] for s in stats),
            "completions": completion_records(  # --log-completions
                self.config, texts, [c for r in rounds for c in r["completions"]],
                [lab for r in rounds for lab in r["labels"]], rewards, keep, normalized, version
            ),
            "times": {
                "time/rollout/generate_s": sum(r["generate_s"] for r in rounds),
                "time/rollout/reward_s": sum(r["reward_s"] for r in rounds),
                **({"time/rollout/env_s": sum(r["episode_stats"]["env_s"] for r in rounds)}
                   if self.episodes is not None else {}),  # multi-turn: environment reset/step time
                "time/rollout/write_s": t4 - t3,
                "time/rollout/total_s": t4 - t0,
                # since this worker's previous rollout: waiting for the weights it samples with
                "time/rollout_idle_s": idle,
            },
        }

    # -- evaluation (relax.runtime.driver.evaluation) --
    def eval_prompts(self) -> list:
        """Every evaluation prompt (``--eval-prompt-data`` or the task's held-out problems)."""
        if self._eval_prompts is None:
            self._eval_prompts = rollout_factory.build_eval_prompts(self.config, self.tokenizer)
        return self._eval_prompts

    def evaluate(self, version: int, weights=None) -> dict:
        """This worker's slice of the evaluation with the weights of policy ``version`` (None: the
        ones the engine holds). The next rollout loads its own version's weights, and neither the
        prompt stream nor the training generator is used."""
        if weights is not None:
            self.weight_sync.receive(weights, self.engine)
        self._services_at(f"the evaluation of policy version {version}")
        return sample_eval_slice(self, version)

    # -- reward services (relax.runtime.cluster.reward_services) --
    def set_reward_services(self, handles: dict) -> None:
        """The Serve handles of the reward model / judge (``metric -> handle``), once they are up."""
        self.reward_fn.connect(handles)

    def _services_at(self, where: str) -> None:
        """Name the step (or evaluation) in the services' errors; drop the stats of earlier calls."""
        if isinstance(self.reward_fn, CombinedRewards):
            self.reward_fn.where = where
            self.reward_fn.take_stats()

    # -- checkpoints --
    def state_dict(self) -> dict:
        return {"prompts": self.prompts.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state, weights=None) -> None:
        self.prompts.load_state_dict(state["prompts"])
        self.generator.set_state(state["generator"])
        if weights is not None:
            self.weight_sync.receive(weights, self.engine)


class RolloutWorker(AttachesDataPlane, JoinsWeightGroup, RolloutCore):
    """The Ray actor (created with ``ray.remote``); attaches to the data plane on ``attach()``."""

    def __init__(self, config, algorithm_spec: str, index: int = 0, weight_sync: WeightSync | None = None):
        super().__init__(config, algorithm_spec, data_plane=None, index=index, weight_sync=weight_sync)

    def rollout(self, step: int, version: int = 0, weights=None, *after) -> tuple[dict, dict]:
        """``step`` with two results (``num_returns=2``): the step's shape, all the training roles
        need to plan, and the whole report, the driver's."""
        report = self.step(step, version, weights, *after)
        return step_shape(report), report
