"""``--gkd-beta`` and ``--gkd-top-k`` through ``run()`` (what ``relax train --in-process`` calls): one step of
the embedded default distilling a perturbed copy of the warm-up model. The first step's rollout comes
before any update, so with one seed every run scores the same samples: its metrics compare the flags."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms.gkd import GKD
from relax.config.run import RunConfig
from relax.models.tiny.weights import load_warmup_model, save_tiny_checkpoint
from relax.rollout.tasks import get_task
from relax.runtime.driver.train import run
from tests.runtime.run_results import training_rows


def _teacher(path):
    model = load_warmup_model()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_tiny_checkpoint(model, path, recipe={"test": "perturbed warm-up"}, base_rates={})
    return str(path)


def _first_step(tmp_path, teacher, name, **gkd) -> dict:
    algorithm = GKD.Config(reward_keys=get_task("addition").reward_keys, n_samples_per_prompt=4, **gkd)
    config = RunConfig(advantage_estimator="gkd", algorithm=algorithm, teacher_checkpoint=teacher, in_process=True,
                       rollout_batch_size=4, num_steps_per_rollout=1, num_rollout=1, seed=5, progress=False,
                       output_dir=str(tmp_path / name))
    run(config)
    return training_rows(tmp_path / name)[0]


@pytest.mark.timeout(300)
def test_beta_and_top_k_change_what_gkd_trains_on(tmp_path):
    teacher = _teacher(tmp_path / "teacher.pt")
    reverse = _first_step(tmp_path, teacher, "beta1", gkd_beta=1.0)
    forward = _first_step(tmp_path, teacher, "beta0", gkd_beta=0.0)
    top2 = _first_step(tmp_path, teacher, "top2", gkd_beta=1.0, gkd_top_k=2)
    # the same samples and the same student: the reverse-KL metric agrees, the loss follows beta
    assert reverse["actor/gkd_reverse_kl"] == pytest.approx(forward["actor/gkd_reverse_kl"], rel=1e-5)
    assert reverse["actor/gkd_loss"] == pytest.approx(reverse["actor/gkd_reverse_kl"], rel=1e-6)  # beta 1: reverse KL
    assert forward["actor/gkd_loss"] != pytest.approx(reverse["actor/gkd_loss"], rel=1e-2)  # beta 0: forward KL
    # two teacher tokens and a rest bin: a lower bound of the whole-vocabulary divergence
    assert 0 < top2["actor/gkd_loss"] < reverse["actor/gkd_loss"]
    # the sampled estimate the teacher role logs for every distillation method
    assert reverse["distill/reverse_kl"] == pytest.approx(forward["distill/reverse_kl"], rel=1e-5)
