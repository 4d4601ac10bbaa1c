"""``relax train --backend megatron --hf-checkpoint DIR``: what the Megatron backend cannot train is
refused by ``relax train`` itself (exit status 2, the flag and the fix named), before Ray starts.

The checks read only the checkpoint's ``config.json`` (no weights, no megatron-core), so they run
without the megatron extra: ``megatron_installed`` is patched to True here.
"""

from __future__ import annotations

import json

import pytest
import torch

import relax.backends.megatron.rules as megatron_pkg

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


@pytest.fixture(autouse=True)
def megatron_present(monkeypatch):
    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: True)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """4 attention heads in 2 key/value groups, 2 layers."""
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return build_tiny_random_checkpoint(tmp_path_factory.mktemp("hf") / "qwen3", "qwen3", hidden=32, layers=2)


def _train(cli, checkpoint, *flags):
    code, out, err = cli("train", "--dry-run", "--backend", "megatron", "--hf-checkpoint", checkpoint, *flags)
    return code, err


def test_a_supported_layout_passes(cli, qwen3):
    assert _train(cli, qwen3, "--tensor-model-parallel-size", 2, "--actor-num-workers", 2)[0] == 0
    assert _train(cli, qwen3, "--pipeline-model-parallel-size", 2, "--actor-num-workers", 4)[0] == 0


def test_tensor_parallel_must_divide_the_key_value_heads(cli, qwen3):
    code, err = _train(cli, qwen3, "--tensor-model-parallel-size", 4, "--actor-num-workers", 4)
    assert code == 2 and "relax train: error:" in err
    assert "--tensor-model-parallel-size 4 must divide the model's num_key_value_heads 2" in err
    assert "use a divisor of 2" in err


def test_pipeline_parallel_must_divide_the_layers(cli, qwen3):
    code, err = _train(cli, qwen3, "--pipeline-model-parallel-size", 3, "--actor-num-workers", 3)
    assert code == 2 and "--pipeline-model-parallel-size 3 must divide the model's 2 layers" in err


def test_an_unsupported_architecture_is_refused(cli, tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(str(tmp_path / "gpt2"))
    code, err = _train(cli, tmp_path / "gpt2")
    assert code == 2
    assert "(model_type 'gpt2') with --backend megatron: the Megatron backend converts llama, qwen2, qwen3" in err
    assert "use --backend torch for this model" in err


def test_rope_scaling_is_refused(cli, qwen3, tmp_path):
    import shutil

    scaled = tmp_path / "scaled"
    shutil.copytree(qwen3, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (scaled / "config.json").write_text(json.dumps(config))
    code, err = _train(cli, scaled)
    assert code == 2 and "is not supported by the Megatron converter (only the default RoPE)" in err


def test_lora_stays_refused_on_megatron(cli, qwen3):
    code, err = _train(cli, qwen3, "--lora-rank", 4)
    assert code == 2 and "--lora-rank is implemented for --backend torch only" in err


def test_the_backend_itself_refuses_a_model_it_cannot_convert():
    """The same rule where the actor ranks build the backend (``run(config)`` with a checkpoint that
    changed after validation, or a caller of ``MegatronBackend.for_policy``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from relax.backends.megatron.families import TinyFamily, family_of
    from relax.models.tiny.weights import load_warmup_model

    assert isinstance(family_of(load_warmup_model()), TinyFamily)
    with pytest.raises(ValueError, match=r"got model_type='gpt2'\. Use the torch backend \(--backend torch\)"):
        family_of(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)))
    with pytest.raises(ValueError, match="not a Linear; use --backend torch for it"):
        family_of(torch.nn.Linear(2, 2))
