"""The rollout role: draw prompts, sample a group of completions per prompt, score them, drop the
groups that carry no signal for this algorithm, normalize the rewards, write the step to the data
plane. ``RolloutCore`` is plain Python (unit-testable); ``RolloutWorker`` is its Ray actor.

With ``--rollout-num-workers N`` there are N rollout workers. Every worker draws the step's whole
prompt batch from its own copy of the prompt stream and keeps its slice ``index`` of it, so the
step's prompts are the same whatever N is; each samples with its own seeded generator and writes
its groups (uids offset by its slice) into the same partition. ``relax.runtime.rollouts`` merges
their reports in worker order, so the plan and the metrics do not depend on which finished first.
"""

from __future__ import annotations

import time

import torch

from relax.algorithms import load_algorithm
from relax.algorithms.types import check_normalized_rewards
from relax.rollout import factory as rollout_factory
from relax.rollout.base import SamplingParams
from relax.rollout.rewards import score
from relax.runtime.fields import AttachesDataPlane
from relax.runtime.metrics import completion_records, response_stats
from relax.runtime.weights import unpack_weights

# Fields the rollout writes for every kept completion. Masks travel as bool (1 byte, not 8: the
# readers want bool anyway). The sampler's per-token log-probs are not written: no role reads them,
# and every field costs a serialization per prompt group on each put and get.
ROLLOUT_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "rewards", "raw_rewards")


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
    def __init__(self, config, algorithm_spec: str, data_plane=None, index: int = 0):
        torch.set_num_threads(1)
        self.config = config
        self.index, self.num_workers = index, config.rollout_num_workers
        self.algorithm = load_algorithm(algorithm_spec)(config.algorithm)
        self.engine = rollout_factory.build_engine(config)
        self.tokenizer = self.engine.tokenizer
        self.prompts = rollout_factory.build_prompt_source(config, self.tokenizer)
        self.reward_fn, self.reward_keys = rollout_factory.reward_setup(config)
        # Worker 0 keeps the run's seed (one worker samples as before); the others are offset far
        # beyond any seed a user picks for another run.
        self.generator = torch.Generator().manual_seed(config.seed + index * 2**32)
        self.params = SamplingParams(
            temperature=config.rollout_temperature,
            top_p=config.rollout_top_p,
            max_new_tokens=config.rollout_max_response_len,
        )
        # Behaviour log-probs travel with the samples only when the loss corrects for staleness.
        self.write_rollout_log_probs = config.algorithm.off_policy_correction != "none"
        self.write_policy_version = config.fully_async
        self.data_plane = data_plane
        self._last_end: float | None = None

    def _my_prompts(self) -> list:
        per_worker = self.config.rollout_batch_size // self.num_workers
        batch = self.prompts.next_batch(self.config.rollout_batch_size)
        return batch[self.index * per_worker : (self.index + 1) * per_worker]

    # -- one training step --
    def step(self, step: int, version: int = 0, weights=None, *after) -> dict:
        """One rollout of this worker's slice with ``weights`` (a state dict, ``PackedWeights``, or
        None: keep the current ones), which are the policy after training step ``version``.
        ``after``: results of that training step's consumers (Ray resolves them before this runs, so
        the rollout never overtakes the training it depends on). The driver drops partitions."""
        t0 = time.perf_counter()
        idle = t0 - self._last_end if self._last_end is not None else 0.0
        if weights is not None:
            self.engine.load_weights(unpack_weights(weights))
        n = self.config.algorithm.n_samples_per_prompt
        prompts = self._my_prompts()
        ids = [self.tokenizer.encode(p.text) for p in prompts]
        repeated = [ids[i] for i in range(len(prompts)) for _ in range(n)]
        t1 = time.perf_counter()
        gen = self.engine.generate(repeated, self.params, generator=self.generator)
        t2 = time.perf_counter()
        batch = gen.batch
        # Plain lists, not per-row tensor indexing (256 small tensor ops cost ~1 ms on 2 cores).
        completions = [
            self.tokenizer.decode([t for t, m in zip(ids, mask) if m])
            for ids, mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist())
        ]
        local = torch.arange(len(prompts)).repeat_interleave(n)
        texts = [prompts[g].text for g in local.tolist()]
        labels = [prompts[g].label for g in local.tolist()]
        meta = [{**prompts[g].metadata, "sample_index": j % n} for j, g in enumerate(local.tolist())]
        rewards = score(self.reward_fn, texts, completions, labels, meta, self.reward_keys,
                        self.config.reward_concurrency)
        t3 = time.perf_counter()
        group_ids = local + self.index * len(prompts)  # unique over the step's workers
        keep = filter_groups(self.algorithm, rewards, group_ids)
        kept_ids = group_ids[keep]
        normalized = (
            self.algorithm.normalize_rewards(rewards[keep], kept_ids) if bool(keep.any()) else torch.zeros(0)
        )
        check_normalized_rewards(self.algorithm, normalized, kept_ids.shape, step=step)
        kept_uids = torch.unique_consecutive(kept_ids).tolist()
        if kept_uids and self.data_plane is not None:
            fields = {
                "prompt_ids": batch.prompt_ids[keep],
                "prompt_mask": batch.prompt_mask[keep].bool(),
                "response_ids": batch.response_ids[keep],
                "response_mask": batch.response_mask[keep].bool(),
                "rewards": normalized.float(),
                "raw_rewards": rewards[keep],
            }
            if self.write_rollout_log_probs:
                fields["rollout_log_probs"] = gen.log_probs[keep].float()
            if self.write_policy_version:
                fields["policy_version"] = torch.full((int(keep.sum()),), version, dtype=torch.long)
            self.data_plane.put_step(step, fields, kept_ids)
        t4 = self._last_end = time.perf_counter()
        tokens_per_group = batch.response_mask[keep].sum(1).view(-1, n).sum(1).tolist() if kept_uids else []
        return {
            "kept_uids": kept_uids,
            "group_size": n,
            "group_tokens": tokens_per_group,
            "version": version,
            "raw_rewards": rewards,
            "group_ids": group_ids,
            "samples": len(repeated),
            "generated_tokens": int(batch.response_mask.sum()),
            # response_len_max, truncated (relax.runtime.metrics.response_metrics merges them)
            **response_stats(
                batch.response_ids, batch.response_mask, self.params.max_new_tokens, self.tokenizer.eos_id
            ),
            "completions": completion_records(  # --log-completions
                self.config, texts, completions, labels, rewards, keep, normalized, version
            ),
            "times": {
                "time/rollout/generate_s": t2 - t1,
                "time/rollout/reward_s": t3 - t2,
                "time/rollout/write_s": t4 - t3,
                "time/rollout/total_s": t4 - t0,
                # since this worker's previous rollout: waiting for the weights it samples with
                "time/rollout_idle_s": idle,
            },
        }

    # -- checkpoints --
    def state_dict(self) -> dict:
        return {"prompts": self.prompts.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state, weights=None) -> None:
        self.prompts.load_state_dict(state["prompts"])
        self.generator.set_state(state["generator"])
        if weights is not None:
            self.engine.load_weights(weights)


class RolloutWorker(AttachesDataPlane, RolloutCore):
    """The Ray actor (created with ``ray.remote``); attaches to the data plane on ``attach()``."""

    def __init__(self, config, algorithm_spec: str, index: int = 0):
        super().__init__(config, algorithm_spec, data_plane=None, index=index)
