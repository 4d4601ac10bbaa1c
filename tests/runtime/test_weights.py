"""relax.runtime.weights.weights: the packed weights the actor sends to the rollout arrive bit for bit."""

import warnings

import numpy as np
import pytest
import torch

from relax.runtime.weights.weights import PackedWeights, pack_weights, unpack_weights


def _mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 5, generator=g),  # 140 bytes: the next tensor needs padding
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "head.bias": torch.randn(5, generator=g, dtype=torch.float64),
        "step": torch.tensor(12345678901, dtype=torch.int64),  # 0-d
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "empty": torch.zeros(0, 3),
    }


def test_pack_unpack_round_trip_is_bit_identical_for_every_dtype_and_shape():
    state = _mixed_state()
    packed = pack_weights(state)
    assert isinstance(packed, PackedWeights) and packed.buffer.dtype == np.uint8
    assert all(offset % 16 == 0 for offset in packed.offsets)
    out = unpack_weights(packed)
    assert list(out) == list(state)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape, name
        assert torch.equal(out[name], tensor), name
        # bit for bit, not only equal values (e.g. -0.0 vs 0.0)
        assert bytes(out[name].contiguous().reshape(-1).view(torch.uint8).numpy()) == bytes(
            tensor.contiguous().reshape(-1).view(torch.uint8).numpy()), name


def test_unpack_of_a_read_only_buffer_copies_it_instead_of_warning():
    packed = pack_weights({"w": torch.arange(6, dtype=torch.float32).view(2, 3)})
    packed.buffer.flags.writeable = False  # as Ray returns it from the object store
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = unpack_weights(packed)
    out["w"].add_(1)  # writable, and the original buffer is untouched
    assert torch.equal(out["w"], torch.arange(1, 7, dtype=torch.float32).view(2, 3))
    assert torch.equal(unpack_weights(packed)["w"], torch.arange(6, dtype=torch.float32).view(2, 3))


@pytest.mark.parametrize("weights", [None, {"w": torch.ones(2)}])
def test_unpack_passes_plain_state_dicts_and_none_through(weights):
    assert unpack_weights(weights) is weights


def test_packed_weights_load_into_the_model_exactly():
    from relax.models.tiny.weights import load_warmup_model

    source, target = load_warmup_model(), load_warmup_model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p))
    target.load_state_dict(unpack_weights(pack_weights(source.state_dict())), strict=True)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name
