"""``--cispo-rule`` through ``relax train`` (``relax.runtime.driver.train.run``): the paper's two-sided clip
bounds more tokens than the upstream rule on the same ratios."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relax.algorithms import get_algorithm
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from run_results import training_rows  # noqa: E402

CISPO = get_algorithm("cispo")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_paper_rule_clips_a_superset_of_the_upstream_rule(ray_cluster, tmp_path):
    rows = {}
    for rule in ("paper", "upstream"):
        # two mini-batches: the first is on-policy (ratio 1, both rules weigh every token 1, so both
        # runs reach the second with the same weights); the second sees ratios far from 1 at lr 1e-2
        run(RunConfig(advantage_estimator="cispo",
                      algorithm=CISPO.Config(n_samples_per_prompt=4, reward_keys=("correct", "digits", "format", "length"),
                                             eps_clip=0.02, cispo_rule=rule),
                      rollout_batch_size=4, num_steps_per_rollout=2, num_rollout=1, lr=1e-2, seed=3,
                      output_dir=str(tmp_path / rule), progress=False))
        rows[rule] = training_rows(tmp_path / rule)[0]
    # the paper clips every token outside [1 - eps, 1 + eps]; upstream only A >= 0 above and A < 0 below
    assert rows["paper"]["actor/pg_clipfrac"] > rows["upstream"]["actor/pg_clipfrac"] > 0
