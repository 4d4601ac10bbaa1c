"""LoRA on the torch backend (``--lora-rank``, peft): only the adapter trains and travels; the rollout's
model (base + merged payload) equals peft's merge of the trained model; checkpoints hold the adapter
and resume; the Hugging Face export writes the merged model and the adapter."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft", reason="the lora extra (peft) is not installed")

from relax.algorithms.types import PolicyLossOutput  # noqa: E402
from relax.backends.torch_backend import TorchBackend  # noqa: E402
from relax.models.batch import TokenBatch  # noqa: E402
from relax.models.hf import export_hf_checkpoint, load_hf_model, load_hf_state_dict  # noqa: E402
from relax.models.hf.lora import ADAPTER_CONFIG_KEY, adapter_settings  # noqa: E402

config_errors = TorchBackend.config_errors
from relax.config.run import RunConfig  # noqa: E402


def _batch(n=6, p=4, t=5, seed=0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    response_mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (n,), generator=g)[:, None]
    return TokenBatch(prompt_ids=torch.randint(5, 40, (n, p), generator=g), prompt_mask=torch.ones(n, p, dtype=torch.bool),
                      response_ids=torch.randint(5, 40, (n, t), generator=g).masked_fill(~response_mask, 0),
                      response_mask=response_mask)


def _loss(batch):
    adv = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(1)) * batch.response_mask

    def loss_fn(lp, rows):
        mask = batch.response_mask[rows]
        return PolicyLossOutput(loss=-(adv[rows] * lp.log_probs * mask).sum() / mask.sum(), metrics={})

    return loss_fn


def _config(ckpt, **kw):
    return RunConfig(hf_checkpoint=str(ckpt), lr=5e-2, lora_rank=4, lora_alpha=8.0, **kw)


def _trained(ckpt, steps=2, **kw):
    backend = TorchBackend.for_policy(_config(ckpt, **kw), load_hf_model(ckpt))
    batch = _batch()
    for _ in range(steps):
        metrics = backend.train_step(batch, _loss(batch))
    return backend, metrics


def test_only_the_adapter_trains_and_is_exported(checkpoints):
    ckpt = checkpoints["qwen3"]
    base = load_hf_model(ckpt).state_dict()
    backend, metrics = _trained(ckpt)
    trainable = [n for n, p in backend.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # every linear layer of every block is adapted (all-linear), the output head is not
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    n_lora = sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    assert metrics["optimizer_state_mib"] * 2**20 == pytest.approx(8 * n_lora + 4 * len(trainable))
    payload = backend.export_weights()
    assert adapter_settings(payload) == {"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.0, "scaling": 2.0,
                                         "target_modules": sorted(["q_proj", "k_proj", "v_proj", "o_proj",
                                                                   "gate_proj", "up_proj", "down_proj"])}
    assert set(payload) - {ADAPTER_CONFIG_KEY} == {n.replace("base_model.model.", "").replace(".default", "")
                                                   for n in trainable}
    assert sum(v.numel() for k, v in payload.items() if k != ADAPTER_CONFIG_KEY) == n_lora
    # base weights untouched by training
    for name, value in backend.model.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if key in base:
            assert torch.equal(value, base[key]), name


def test_the_rollout_model_equals_the_merged_trained_model(checkpoints):
    ckpt = checkpoints["qwen2"]  # qkv biases: merging must leave them alone
    backend, _ = _trained(ckpt, steps=3)
    merged = copy.deepcopy(backend.model).merge_and_unload()  # peft's own merge
    rollout = load_hf_model(ckpt)  # what the HF engine holds, then load_weights(payload)
    load_hf_state_dict(rollout, backend.export_weights())
    expected = merged.state_dict()
    for name, value in rollout.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(rollout.state_dict()["model.layers.0.mlp.up_proj.weight"],
                           load_hf_model(ckpt).state_dict()["model.layers.0.mlp.up_proj.weight"])
    # a second payload merges into the base, not on top of the first merge
    backend.train_step(_batch(), _loss(_batch()))
    load_hf_state_dict(rollout, backend.export_weights())
    expected = copy.deepcopy(backend.model).merge_and_unload().state_dict()
    for name, value in rollout.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6, msg=name)
    # and the rollout's log-probs equal the trainer's (x @ (W + BA s) vs x @ W + (x @ A) @ B s: float32 rounding)
    batch = _batch(seed=4)
    plain = TorchBackend(rollout, forward_logits=backend.forward_logits)
    torch.testing.assert_close(plain.compute_log_probs(batch).log_probs, backend.compute_log_probs(batch).log_probs,
                               rtol=1e-5, atol=1e-5)


def test_checkpoint_holds_the_adapter_and_resumes_exactly(checkpoints, tmp_path):
    ckpt = checkpoints["llama"]
    a, _ = _trained(ckpt, steps=2, lora_target_modules=("q_proj", "v_proj"))
    state = a.state_dict()
    assert ADAPTER_CONFIG_KEY in state["model"]
    assert all(".lora_" in k for k in state["model"] if k != ADAPTER_CONFIG_KEY)
    batch = _batch()
    a.train_step(batch, _loss(batch))
    b = TorchBackend.for_policy(_config(ckpt, lora_target_modules=("q_proj", "v_proj")), load_hf_model(ckpt))
    b.load_state_dict(state)
    b.train_step(batch, _loss(batch))
    pa, pb = a.export_weights(), b.export_weights()
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    # the export: merged model in hf/, the adapter in PEFT format in hf/adapter
    out = export_hf_checkpoint(pa, ckpt, tmp_path / "hf")
    from peft import PeftModel

    exported = load_hf_model(out).state_dict()
    via_peft = PeftModel.from_pretrained(load_hf_model(ckpt), str(out / "adapter")).merge_and_unload().state_dict()
    for name, value in exported.items():
        torch.testing.assert_close(value, via_peft[name], rtol=0, atol=1e-6, msg=name)


def test_lora_flags_are_checked_naming_the_flag(checkpoints):
    assert config_errors(_config(checkpoints["qwen3"])) == []
    assert any("--hf-checkpoint" in e for e in config_errors(RunConfig(lora_rank=4)))
    assert config_errors(RunConfig(lora_alpha=32.0)) == ["--lora-alpha has no effect without --lora-rank"]
    assert any("--lora-target-modules" in e for e in config_errors(RunConfig(lora_target_modules=("q_proj",))))
    from relax.backends.megatron import MegatronEntry

    megatron_errors = MegatronEntry.config_errors

    assert any("--lora-rank" in e and "torch" in e for e in megatron_errors(RunConfig(lora_rank=4, backend="megatron")))
    with pytest.raises(ValueError, match="--lora-target-modules nope"):
        TorchBackend.for_policy(_config(checkpoints["qwen3"], lora_target_modules=("nope",)),
                                load_hf_model(checkpoints["qwen3"]))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)  # two runs: the collective transport and the object store
@pytest.mark.filterwarnings("ignore")
def test_relax_train_with_lora_sends_the_adapter_and_exports_merged_and_adapter(ray_cluster, tmp_path, monkeypatch,
                                                                                capsys):
    """``relax train --hf-checkpoint ... --lora-rank 4``: the rollout merges each step's adapter (the run
    would stop on a payload it cannot merge), the checkpoint's actor weights are the adapter alone, and
    hf/ holds the merged model with the adapter in hf/adapter (equal to peft's merge of it). The adapter
    travels by broadcast (``--weight-transport collective``), and the run equals the object store's:
    the same rollouts (sampled with the merged adapters) and the same adapter, bit for bit."""
    import json
    import shutil
    from pathlib import Path

    from peft import PeftModel

    from relax.cli.main import build_parser, prepare_train_config
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint
    from relax.runtime.driver.train import run
    from relax.runtime.files.checkpoint_files import checkpoint_path

    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny-qwen3", "qwen3")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + {i + 1} =", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    shutil.copy(Path(__file__).parent / "toy_reward.py", ray_cluster / "lora_toy_reward.py")
    monkeypatch.chdir(ray_cluster)
    monkeypatch.syspath_prepend(str(ray_cluster))
    out = tmp_path / "out"
    parser, subparsers = build_parser()
    argv = ["train", "--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages", "--hf-checkpoint",
            str(ckpt), "--prompt-data", str(data), "--custom-rm-path", "lora_toy_reward:reward", "--reward-keys",
            "digits", "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "8", "--lr", "5e-2", "--lora-rank", "4", "--lora-alpha", "8",
            "--lora-target-modules", "q_proj", "v_proj", "up_proj", "--save-interval", "2", "--no-progress"]
    run(prepare_train_config([*argv, "--output-dir", str(out), "--weight-transport", "collective"], parser,
                             subparsers["train"])[0])
    assert "relax: weights: collective broadcast (gloo) from actor rank 0 to 1 rollout worker(s)" in capsys.readouterr().err
    by_store = tmp_path / "by_store"
    run(prepare_train_config([*argv, "--output-dir", str(by_store)], parser, subparsers["train"])[0])
    assert "collective broadcast" not in capsys.readouterr().err

    def numbers(directory):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/")) and not k.endswith("_per_s")}
                for line in (directory / "metrics.jsonl").read_text().splitlines()]

    assert numbers(out) == numbers(by_store)
    stored = torch.load(checkpoint_path(by_store, 2), weights_only=False)["actor"]["backend"]["model"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)
    state = torch.load(checkpoint_path(out, 2), weights_only=False)
    adapter = state["actor"]["backend"]["model"]
    assert all(torch.equal(adapter[k], stored[k]) for k in adapter if k != ADAPTER_CONFIG_KEY) and set(adapter) == set(stored)
    assert adapter_settings(adapter)["target_modules"] == ["q_proj", "up_proj", "v_proj"]
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter if k != ADAPTER_CONFIG_KEY)
    hf = checkpoint_path(out, 2).parent / "hf"
    merged = load_hf_model(hf).state_dict()
    via_peft = PeftModel.from_pretrained(load_hf_model(ckpt), str(hf / "adapter")).merge_and_unload().state_dict()
    base = load_hf_model(ckpt).state_dict()
    for name, value in merged.items():
        torch.testing.assert_close(value, via_peft[name], rtol=0, atol=1e-6, msg=name)
        if not any(m in name for m in ("q_proj", "v_proj", "up_proj")):
            assert torch.equal(value, base[name]), name  # only adapted layers move
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
