"""DAPO's over-long handling through ``relax train`` (``relax.runtime.driver.train.run``, two steps on the
built-in addition prompts): the soft punishment as a ``--custom-rm-path`` reward component, and
``--overlong-filter``, each with its effect on what the run logs and trains."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from run_results import training_rows  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

L_MAX, L_CACHE = 6, 3  # --rollout-max-response-len and the punishment interval

# The punishment, plus the token count as a second component with weight 0 (logged, not trained on).
REWARD = textwrap.dedent('''
    from relax.rewards import overlong, shaping

    def tokens(prompt, completion, label, metadata):
        return {"tokens": float(metadata["response_tokens"])}

    reward = shaping.combine(overlong.soft_punishment(cache_length=3), tokens)
''')


def _by_hand(length: float) -> float:
    if length <= L_MAX - L_CACHE:
        return 0.0
    return ((L_MAX - L_CACHE) - length) / L_CACHE if length <= L_MAX else -1.0


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    (ray_cluster / "overlong_reward.py").write_text(REWARD)
    base = tmp_path_factory.mktemp("overlong")
    out = {}
    for name, overlong_filter in (("plain", False), ("filtered", True)):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(ray_cluster)  # the driver imports the reward module from its working directory
            run(RunConfig(advantage_estimator="grpo",
                          algorithm=AlgorithmConfig(n_samples_per_prompt=4, reward_keys=("overlong", "tokens"),
                                                    reward_weights=(1.0, 0.0)),
                          custom_rm_path="overlong_reward:reward", overlong_filter=overlong_filter,
                          rollout_batch_size=4, num_steps_per_rollout=1, num_rollout=2, rollout_max_response_len=L_MAX,
                          log_completions=16, seed=3, output_dir=str(base / name), progress=False))
        samples = [json.loads(line) for line in (base / name / "completions.jsonl").read_text().splitlines()]
        out[name] = (training_rows(base / name), [s for s in samples if s["step"] == 1])
    return out


def test_the_soft_punishment_is_a_reward_component(runs):
    rows, samples = runs["plain"]
    assert len(samples) == 16  # the whole first step
    values = [s["rewards"]["overlong"] for s in samples]
    assert values == [_by_hand(s["rewards"]["tokens"]) for s in samples]
    assert 0.0 in values and -1.0 in values, "the fixed seed should give short and cut responses"
    assert rows[0]["reward/overlong/mean"] == pytest.approx(sum(values) / 16)


def test_the_filter_drops_truncated_samples_from_the_loss(runs):
    (plain_rows, _), (rows, samples) = runs["plain"], runs["filtered"]
    kept = [s for s in samples if s["normalized_reward"] is not None]
    cut = [s for s in kept if s["rewards"]["tokens"] == L_MAX and not s["completion"].endswith("<eos>")]
    assert kept and 0 < len(cut) < len(kept)
    assert rows[0]["rollout/overlong_filtered_frac"] == pytest.approx(len(cut) / len(kept))
    assert "rollout/overlong_filtered_frac" not in plain_rows[0]
    # the same rollout (same seed, same weights), a different loss: the cut samples no longer count
    assert rows[0]["reward/overlong/mean"] == plain_rows[0]["reward/overlong/mean"]
    assert rows[0]["actor/pg_loss"] != pytest.approx(plain_rows[0]["actor/pg_loss"], rel=1e-4)
