"""The reward services' parts: the batched reward-model score against the model called directly, the
judge's yes-probability on hand-checkable logits, the rollout side that sends a round's samples at
once and keeps the components in ``--reward-keys`` order, and the per-step metrics. The Serve
deployment itself is exercised end to end (test_reward_services_run.py, which compares the served scores with
the model too)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from relax.models.hf.tiny_random import build_tiny_random_checkpoint, build_tiny_reward_model
from relax.rollout.reward_scorers import (
    JudgeScorer,
    SequenceScorer,
    answer_tokens,
    fill_template,
    template_problem,
    yes_probability,
)
from relax.rollout.reward_services import CombinedRewards, Service
from relax.rollout.rewards import RewardError
from relax.runtime.cluster.reward_services import service_gpus
from relax.runtime.metrics.step_metrics import service_metrics

SAMPLES = [("What is 1 + 2?", " 3", 3), ("Hi", " a much longer completion than the others", None),
           ("x", "", "gold"), ("Add 4 and 5.", " 9<eos>", 9)]
TEMPLATE = "Q: {prompt}\nA: {response}\nGold: {label}\nIs A right?"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_services")
    return build_tiny_reward_model(root / "rm"), build_tiny_random_checkpoint(root / "judge", "qwen2")


def test_a_batched_reward_model_score_equals_the_model_on_each_text_alone(models):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = str(models[0])
    served = SequenceScorer(rm).score(SAMPLES)  # one right-padded batch
    model = AutoModelForSequenceClassification.from_pretrained(rm).eval()
    tokenizer = AutoTokenizer.from_pretrained(rm)
    with torch.no_grad():
        direct = [float(model(**tokenizer(p + c, return_tensors="pt")).logits[0, 0]) for p, c, _ in SAMPLES]
    assert served == pytest.approx(direct, abs=1e-5)
    assert len({round(s, 4) for s in served}) == len(SAMPLES)  # the texts are scored apart


def test_the_yes_probability_on_logits_checked_by_hand():
    logits = torch.tensor([[0.0, 2.0, 0.5, 9.0], [1.0, -1.0, 1.0, -3.0], [0.0, 0.0, 3.0, 0.0]])
    # yes = token 1, no = token 2: e^l_yes / (e^l_yes + e^l_no); the other logits do not matter
    expected = [math.exp(2) / (math.exp(2) + math.exp(0.5)), math.exp(-1) / (math.exp(-1) + math.exp(1)),
                1 / (1 + math.exp(3))]
    assert yes_probability(logits, 1, 2).tolist() == pytest.approx(expected, rel=1e-12)


def test_the_judge_scores_the_filled_template_like_the_model_called_directly(models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    judge = str(models[1])
    tokenizer = AutoTokenizer.from_pretrained(judge)
    prefix, yes, no = answer_tokens(tokenizer)
    # a byte tokenizer: " yes" and " no" share the space, then differ at "y" / "n"
    assert tokenizer.decode(prefix) == " " and tokenizer.decode([yes, no]) == "yn"
    served = JudgeScorer(judge, TEMPLATE).score(SAMPLES)
    model = AutoModelForCausalLM.from_pretrained(judge).eval()
    direct = []
    with torch.no_grad():
        for p, c, label in SAMPLES:
            ids = tokenizer.encode(TEMPLATE.replace("{prompt}", p).replace("{response}", c)
                                   .replace("{label}", "" if label is None else str(label))) + prefix
            last = model(torch.tensor([ids])).logits[0, -1]
            direct.append(1 / (1 + math.exp(-(float(last[yes]) - float(last[no])))))
    assert served == pytest.approx(direct, abs=1e-6)
    assert all(0 < s < 1 for s in served)


def test_the_template_keeps_other_braces_and_needs_prompt_and_response():
    assert fill_template('{"q": "{prompt}"} {response} [{label}]', "P", "R", None) == '{"q": "P"} R []'
    assert template_problem("{prompt} {response}") is None
    assert "no {response} placeholder" in template_problem("Judge {prompt}:")


class FakeHandle:
    """A Serve handle stand-in: requests pile up until ``result`` is first asked, then are scored as
    one batch (as @serve.batch would), so the test sees what the service would count."""

    def __init__(self, fail_on: str | None = None):
        self.pending, self.batches, self.fail_on = [], 0, fail_on

    def remote(self, sample):
        self.pending.append(sample)
        return FakeResponse(self, len(self.pending) - 1)

    def flush(self):
        if self.pending:
            self.batches += 1
            self.done = [(len(p + c), f"b{self.batches}", len(self.pending), p == self.fail_on)
                         for p, c, _ in self.pending]
            self.pending = []


class FakeResponse:
    def __init__(self, handle, i):
        self.handle, self.i = handle, i

    def result(self, timeout_s=None):
        self.handle.flush()
        score, batch, size, fail = self.handle.done[self.i]
        if fail:
            raise RuntimeError("Traceback ...\nValueError: the replica ran out of memory")
        return {"score": float(score), "batch": batch, "size": size}


def _reward(prompt, completion, label, metadata):
    return {"len": float(len(completion)), "first": float(metadata["i"])}


def test_combined_rewards_fill_the_keys_in_order_and_count_the_batches():
    services = [Service("rm", "reward_model", "--reward-model-path RM", "--reward-model-key")]
    combined = CombinedRewards(_reward, ("len", "first"), services, ("first", "rm", "len"))
    combined.connect({"reward_model": FakeHandle()})
    prompts, completions = ["a", "bb", "ccc"], ["x", "yy", ""]
    m = combined.matrix(prompts, completions, [None] * 3, [{"i": i} for i in range(3)])
    assert m.dtype == torch.float64
    assert m.tolist() == [[0.0, 2.0, 1.0], [1.0, 4.0, 2.0], [2.0, 3.0, 0.0]]
    stats = combined.take_stats()["reward_model"]
    assert stats["batches"] == {"b1": 3} and stats["time_s"] > 0  # all three in one batched call
    assert combined.take_stats()["reward_model"] == {"batches": {}, "time_s": 0.0}


def test_a_failing_service_call_names_the_service_the_sample_and_the_step():
    services = [Service("rm", "reward_model", "--reward-model-path RM", "--reward-model-key")]
    combined = CombinedRewards(_reward, ("len",), services, ("len", "rm"))
    combined.connect({"reward_model": FakeHandle(fail_on="bb")})
    combined.where = "step 7"
    with pytest.raises(RewardError, match=r"step 7: sample 1: the reward model service \(--reward-model-path RM\) "
                                          r"failed on prompt 'bb'.*ValueError: the replica ran out of memory"):
        combined.matrix(["a", "bb"], ["x", "y"], [None] * 2, [{"i": 0}, {"i": 1}])


def test_step_metrics_count_a_batch_shared_by_two_workers_once():
    worker0 = {"reward_model": {"batches": {"r1-1": 12, "r1-2": 4}, "time_s": 0.5}}
    worker1 = {"reward_model": {"batches": {"r1-1": 12}, "time_s": 0.75}}
    metrics = service_metrics([worker0, worker1])
    assert metrics == {"reward_model/batch_size_mean": 8.0, "reward_model/calls": 2.0, "reward_model/replicas_used": 1.0,
                       "reward_model/time_s": 0.75}


def test_the_replica_settings_follow_the_flags(tmp_path):
    from relax.config.run import RunConfig
    from relax.runtime.cluster.reward_services import service_settings

    template = tmp_path / "t.txt"
    template.write_text("{prompt} {response}")
    config = RunConfig(reward_model_path="RM", reward_model_replicas=3, reward_model_cpus=2.0, judge_model_path="J",
                       judge_template=str(template), judge_gpus=0.25, judge_batch_size=4, judge_batch_wait_s=0.5)
    rm = service_settings(config, "reward_model", free_gpus=2.0, total_replicas=4)
    assert (rm["path"], rm["replicas"], rm["cpus"], rm["gpus"], rm["template"]) == (os.path.abspath("RM"), 3, 2.0, 0.5, None)
    judge = service_settings(config, "judge", free_gpus=2.0, total_replicas=4)
    assert (judge["gpus"], judge["batch_size"], judge["batch_wait_s"], judge["template"]) == (
        0.25, 4, 0.5, "{prompt} {response}")


def test_the_default_gpu_request_shares_the_free_gpus():
    assert service_gpus(0.0, 2) == 0.0 and service_gpus(-1.0, 1) == 0.0
    assert service_gpus(1.0, 2) == 0.5 and service_gpus(3.0, 2) == 1.0


def test_the_call_before_training_names_the_service_that_fails(tmp_path):
    from relax.config.run import RunConfig
    from relax.runtime.cluster.reward_services import RewardServices
    from relax.runtime.session.waits import WorkerDied

    services = RewardServices(RunConfig(reward_model_path="RM"), free_gpus=0.0)
    services.handles = {"reward_model": FakeHandle(fail_on="What is 2 + 3?")}
    with pytest.raises(WorkerDied, match=r"pre-flight call of the reward model service \(--reward-model-path RM\) "
                                         r"on the sample .*ValueError: the replica ran out of memory"):
        services.check(services.services[0], timeout=5)
    services.handles = {"reward_model": FakeHandle()}
    assert services.check(services.services[0], timeout=5) == len("What is 2 + 3?" + " 5")
