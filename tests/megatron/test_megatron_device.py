"""The Megatron backend where its model is not on the CPU, checked on a CPU-only machine.

On a GPU the backend failed twice at main 1b1c888: the model stayed on the CPU (``--bf16``:
Megatron's mixed-precision optimizer refused its CPU parameters), and the model's inputs were built
on the CPU beside a model on the GPU (float32: a device mismatch in the forward pass). Here the model
is put on torch's ``meta`` device, which refuses a CPU tensor beside it just as CUDA does, so any
input, mask or target the backend leaves on the CPU fails these tests: the backend's model moved
there after construction (at 1b1c888 this fails at the same line as on the GPU), the backend built
on a rank whose device is ``meta`` (model, bf16 weights and float32 masters must all land there),
and a forward and backward through the backend's input and log-prob code.

What needs a real GPU (NCCL, Megatron's CUDA-only buffers and optimizer checks, Transformer Engine)
cannot run here: for that, the pieces that decide placement are checked one by one below (the rank's
device, the CPU patches off on CUDA, the process-group backend, the layer spec and its names).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None,
                       reason="megatron-core is not installed"),
]

from megatron_harness import run_distributed  # noqa: E402
import megatron_device_workers as D  # noqa: E402
import megatron_workers as W  # noqa: E402

META = "meta"


@pytest.fixture(scope="module")
def beside_the_model():
    return run_distributed(D.passes_beside_the_model, 1)[0]


@pytest.mark.timeout(240)
def test_log_probs_are_computed_on_the_models_device(beside_the_model):
    batch = W.make_batch()
    shape = tuple(batch.response_mask.shape)
    assert beside_the_model["cpu_log_probs"] == ("cpu", torch.float32, shape)
    # the schedule moved the CPU batch to the model: log-probs and entropy come back from there
    assert beside_the_model["log_probs"] == (META, torch.float32, shape)
    assert beside_the_model["entropy"] == (META, torch.float32, shape)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_backend_builds_its_model_on_the_ranks_device(beside_the_model, precision):
    built = beside_the_model[f"built_{precision}"]
    weight_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert built["device"] == META
    assert built["params"] and {p[:2] for p in built["params"].values()} == {(META, weight_dtype)}
    # the optimizer's float32 weights (with --bf16 Megatron's master copies) are made there too
    assert {m[:2] for m in built["masters"].values()} == {(META, torch.float32)}
    assert built["log_probs"] == (META, torch.float32, tuple(W.make_batch().response_mask.shape))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_forward_and_backward_run_on_the_models_device(beside_the_model, precision):
    run = beside_the_model[precision]
    batch = W.make_batch()
    n, s = batch.input_ids.shape
    weight_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert run["logits"] == (META, weight_dtype, (n, s, W.CFG.vocab_size))  # bf16 logits stay bf16
    assert run["log_probs"] == (META, torch.float32, tuple(batch.response_mask.shape))
    assert run["loss"] == (META, torch.float32, ())
    assert run["params"]  # every parameter got its gradient, on its device, in its shape and dtype
    for name, (device, dtype, shape) in run["params"].items():
        assert device == META and dtype == weight_dtype, name
        assert run["grads"][name] == (META, dtype, shape), name


# -- the placement decisions, with CUDA faked in this process ------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` as a 2-GPU machine would answer; ``set_device`` calls are recorded."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return calls


@pytest.mark.timeout(120)
def test_a_rank_trains_on_its_local_gpu_made_current(fake_cuda, monkeypatch):
    from relax.backends.megatron import placement

    monkeypatch.setenv("LOCAL_RANK", "1")
    assert placement.training_device() == torch.device("cuda", 1)
    assert fake_cuda == [1]  # made current before Megatron allocates on the current device
    monkeypatch.setenv("LOCAL_RANK", "3")  # more local ranks than GPUs: shared out
    assert placement.training_device() == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")  # one process, no launcher: the first GPU
    assert placement.training_device() == torch.device("cuda", 0)


@pytest.mark.timeout(120)
def test_without_cuda_a_rank_trains_on_the_cpu(monkeypatch):
    from relax.backends.megatron import placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placement.training_device() == torch.device("cpu")
    assert placement.process_group_backend() == "gloo"


@pytest.mark.timeout(120)
def test_on_cuda_the_cpu_patches_stay_off_and_ranks_talk_over_nccl(fake_cuda, monkeypatch):
    from relax.backends.megatron import _cpu_compat, load_megatron_backend, placement

    MegatronBackend = load_megatron_backend()  # noqa: N806 (the class)
    # The patches are process-wide: an earlier CPU test in this process may have applied them, so the
    # check is that preparing a CUDA rank never applies them (and a CPU rank does).
    real_apply, applied = _cpu_compat.apply, []
    monkeypatch.setattr(_cpu_compat, "apply", lambda: applied.append(True))
    placement.prepare_megatron(torch.device("cuda", 0))
    assert applied == []
    placement.prepare_megatron(torch.device("cpu"))
    assert applied == [True]
    # NCCL even for a source model on the CPU: the backend builds its own copy on the GPU
    assert MegatronBackend.process_group_kind(torch.nn.Linear(2, 2)) == "nccl"
    with pytest.raises(RuntimeError, match="CUDA is available"):
        real_apply()


@pytest.mark.timeout(120)
def test_transformer_engine_spec_only_on_cuda_where_it_imports(monkeypatch):
    from relax.backends.megatron import layer_specs
    from relax.backends.megatron.attention import sdpa_core_attention_class

    monkeypatch.setattr(layer_specs, "transformer_engine_importable", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not layer_specs.uses_transformer_engine()  # never on the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert layer_specs.uses_transformer_engine()
    monkeypatch.setattr(layer_specs, "transformer_engine_importable", lambda: False)
    assert not layer_specs.uses_transformer_engine()  # the H200 image: no transformer_engine
    spec = layer_specs.layer_spec(qk_layernorm=True, normalization="RMSNorm")
    assert spec.submodules.self_attention.submodules.core_attention is sdpa_core_attention_class()


@pytest.mark.timeout(120)
def test_transformer_engine_fused_norm_names_map_to_the_local_names():
    from relax.backends.megatron.layer_specs import canonical_name

    te = {
        "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
        "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
        "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
        "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
    }
    for layer in (0, 3):
        for fused, local in te.items():
            assert canonical_name(f"decoder.layers.{layer}.{fused}") == f"decoder.layers.{layer}.{local}"
    for unchanged in ("decoder.layers.3.self_attention.linear_qkv.weight",
                      "decoder.layers.0.mlp.linear_fc1.bias",
                      "decoder.layers.1.input_layernorm.weight",
                      "embedding.word_embeddings.weight",
                      "decoder.layers.2.self_attention.q_layernorm.weight"):
        assert canonical_name(unchanged) == unchanged
