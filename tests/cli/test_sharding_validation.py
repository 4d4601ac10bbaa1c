"""``--sharding``: what cannot be sharded is refused by ``relax train`` before anything starts, naming the flag."""

from __future__ import annotations

import pytest
import yaml

import relax.backends.megatron.rules as megatron_pkg
from relax.backends import sharding
from relax.config.run import RunConfig


def _rejected(cli, *argv) -> str:
    code, out, err = cli("train", "--dry-run", *argv)
    assert code == 2, f"expected exit 2, got {code}; stderr: {err}"
    assert "relax train: error:" in err
    return err


def test_sharding_needs_two_ranks_and_the_torch_backend(cli, monkeypatch):
    err = _rejected(cli, "--sharding", "fsdp")
    assert "--sharding fsdp shards over the data-parallel ranks, and --actor-num-workers 1 gives one" in err
    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: True)
    err = _rejected(cli, "--sharding", "fsdp", "--backend", "megatron", "--actor-num-workers", 2)
    assert "--sharding fsdp is implemented for --backend torch only" in err
    code, out, err = cli("train", "--dry-run", "--sharding", "fsdp", "--actor-num-workers", 2)
    assert code == 0, err
    assert yaml.safe_load(out)["sharding"] == "fsdp"


def test_sharding_refuses_a_model_without_decoder_layers(tmp_path, monkeypatch):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    path = str(build_tiny_random_checkpoint(tmp_path / "hf", "qwen3", hidden=32, layers=1))
    config = RunConfig(hf_checkpoint=path, sharding="fsdp", actor_num_workers=2)
    assert sharding.config_errors(config) == []  # its decoder layers are found (on the meta device)
    monkeypatch.setattr(sharding, "decoder_layers", lambda model: None)  # a model of another layout
    [error] = sharding.config_errors(config)
    assert error.startswith("--sharding fsdp: Qwen3ForCausalLM") and "drop --sharding" in error


@pytest.mark.parametrize("value", ["zero3", "FSDP"])
def test_unknown_sharding_mode_is_refused(cli, value):
    err = _rejected(cli, "--sharding", value)
    assert "--sharding" in err
