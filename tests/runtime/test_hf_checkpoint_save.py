"""``--hf-checkpoint`` runs save every checkpoint in Hugging Face format as well (``<step dir>/hf``),
and always save the final step, through the real Ray path on the session's shared cluster."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.train import run
from relax.runtime.files.checkpoint_files import checkpoint_path

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore")]


@pytest.mark.timeout(300)
def test_hf_run_writes_a_loadable_hf_checkpoint_at_the_final_step(ray_cluster, tmp_path, monkeypatch):
    from relax.models.hf import load_hf_model
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny-llama", "llama", hidden=64, layers=1)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"q": f"{i} + {i}?", "a": str(2 * i)}) + "\n" for i in range(8)))
    # Two components that vary between samples of a random model, so the optimizer really steps.
    (ray_cluster / "relax_hf_save_reward.py").write_text(textwrap.dedent('''
        def reward(prompt, completion, label, metadata):
            text = completion.removesuffix("<eos>").removesuffix("<|im_end|>")
            return {"digits": sum(c.isdigit() for c in text) / max(len(text), 1), "chars": min(len(text), 8) / 8}
    '''))
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "out"
    config = RunConfig(
        advantage_estimator="gdpo",
        algorithm=AlgorithmConfig(reward_keys=("digits", "chars"), n_samples_per_prompt=4),
        hf_checkpoint=str(ckpt), prompt_data=str(data), input_key="q", label_key="a",
        custom_rm_path="relax_hf_save_reward:reward", rollout_batch_size=2, num_steps_per_rollout=1,
        num_rollout=2, rollout_max_response_len=8, lr=1e-3, seed=5, output_dir=str(out), progress=False,
    )  # no --save-interval: the final step is saved anyway
    summary = run(config)
    assert summary.checkpoint == str(checkpoint_path(out, 2)) and not checkpoint_path(out, 1).exists()

    weights = torch.load(checkpoint_path(out, 2), weights_only=False)["actor"]["backend"]["model"]
    hf_dir = checkpoint_path(out, 2).parent / "hf"
    assert (hf_dir / "config.json").is_file() and (hf_dir / "tokenizer_config.json").is_file()
    exported = load_hf_model(hf_dir).state_dict()
    for name, value in weights.items():  # the saved directory holds exactly the trained weights
        assert torch.equal(exported[name], value), name
    initial = load_hf_model(ckpt).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in weights.items()), "no optimizer step was saved"
