"""relax.runtime.weights.collective_sync: the broadcast transport delivers the object store's weights bit for
bit, versions published ahead of the rollouts that take them (--fully-async), and its errors name the
flag and the group. The ends run as threads of this process, over gloo, as the workers run them."""

from __future__ import annotations

import threading

import pytest
import torch

from relax.config.run import RunConfig
from relax.runtime.weights.collective_sync import CollectiveSync, Ticket, WeightGroup, group_kind
from relax.runtime.weights.weight_sync import ObjectStoreSync, make_weight_sync

pytestmark = pytest.mark.timeout(60)


class _Engine:
    def __init__(self):
        self.loaded: list[dict] = []

    def load_weights(self, weights):
        self.loaded.append({k: v.clone() for k, v in weights.items()})


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(7, 5, generator=g),  # 140 bytes: the next tensor starts after padding
        "norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "head.bias": torch.randn(5, generator=g, dtype=torch.float64),
        "steps": torch.tensor(12345678901, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(4, 6, generator=g).t(),
        "negative_zero": torch.tensor([-0.0, 0.0]),
    }


def _connected(receivers: int, dtype=None) -> tuple[CollectiveSync, list[CollectiveSync]]:
    """A sender and ``receivers`` receivers joined in one gloo group (each join waits for the others)."""
    sender, ends = CollectiveSync(dtype, timeout_s=30), [CollectiveSync(dtype, timeout_s=30) for _ in range(receivers)]
    group = WeightGroup(sender.open(), 1 + receivers, "gloo")
    errors = []

    def join(end, rank):
        try:
            end.join(group, rank)
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(e, r)) for r, e in enumerate([sender, *ends])]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert not errors, errors
    return sender, ends


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _assert_bit_identical(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert _bits(got[name]) == _bits(tensor), name


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_two_receivers_get_the_object_stores_weights_bit_for_bit(dtype):
    sender, receivers = _connected(2, dtype)
    state = _state(0)
    expected = ObjectStoreSync(dtype).publish(state).unpack()
    ticket = sender.publish(state, 1)
    assert ticket == Ticket(1)
    for receiver in receivers:
        engine = _Engine()
        receiver.receive(ticket, engine)
        _assert_bit_identical(engine.loaded[0], expected)


def test_a_lora_adapter_payload_travels_as_exported():
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from relax.models.hf.lora import ADAPTER_CONFIG_KEY, adapter_payload, is_adapter_payload

    model = torch.nn.Sequential(torch.nn.Linear(6, 4))
    model = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["0"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    payload = adapter_payload(model)
    assert is_adapter_payload(payload) and ADAPTER_CONFIG_KEY in payload
    sender, (receiver,) = _connected(1, torch.bfloat16)  # a LoRA payload is never cast
    engine = _Engine()
    receiver.receive(sender.publish(payload, 1), engine)
    expected = ObjectStoreSync(torch.bfloat16).publish(payload).unpack()
    _assert_bit_identical(engine.loaded[0], expected)


def test_versions_published_ahead_are_kept_until_a_rollout_moves_past_them():
    """--fully-async: rank 0 publishes versions 1..3 while the rollout still samples with older ones;
    each is taken by version, and an evaluation of a newer one does not drop what a rollout needs."""
    sender, (receiver,) = _connected(1)
    states = {v: _state(v) for v in (1, 2, 3)}
    tickets = {v: sender.publish(s, v) for v, s in states.items()}
    engine = _Engine()
    receiver.receive(tickets[3], engine)  # an evaluation of version 3
    receiver.receive(tickets[1], engine)  # the next rollout samples with version 1
    receiver.forget_older(2)  # ... and the one after it with version 2
    receiver.receive(tickets[2], engine)
    for loaded, v in zip(engine.loaded, (3, 1, 2)):
        _assert_bit_identical(loaded, states[v])
    assert sorted(receiver._kept) == [2, 3]


def test_a_version_never_published_times_out_naming_the_flag_and_the_group():
    sender, (receiver,) = _connected(1)
    receiver.timeout_s = 0.2
    with pytest.raises(RuntimeError, match=r"--weight-transport collective: policy version 7 did not arrive.*"
                                           + sender._address.replace(".", r"\.")):
        receiver.receive(Ticket(7), _Engine())


def test_a_receiver_given_another_transports_handle_is_told_so():
    with pytest.raises(TypeError, match="same transport"):
        CollectiveSync().receive(ObjectStoreSync().publish({"w": torch.ones(1)}), _Engine())


def test_joining_a_group_nobody_hosts_names_the_address():
    end = CollectiveSync(timeout_s=1)
    with pytest.raises(RuntimeError, match=r"rollout worker 0 could not join the weight group at 127\.0\.0\.1:1 "):
        end.join(WeightGroup("127.0.0.1:1", 2, "gloo"), 1)


def test_the_transport_travels_to_a_worker_without_its_live_group():
    import pickle

    sender, _ = _connected(1)
    copy = pickle.loads(pickle.dumps(sender))
    assert copy._group is None and copy._store is None and copy.dtype is None and copy.timeout_s == 30


def test_the_flag_chooses_the_transport_and_the_group_kind_follows_the_devices():
    assert type(make_weight_sync(RunConfig())) is ObjectStoreSync
    assert type(make_weight_sync(RunConfig(weight_transport="collective"))) is CollectiveSync
    assert group_kind(["cuda:0 (H200, CUDA_VISIBLE_DEVICES=0)", "cuda:0 (H200, CUDA_VISIBLE_DEVICES=1)"]) == "nccl"
    assert group_kind(["cuda:0 (H200, CUDA_VISIBLE_DEVICES=0)", "cpu"]) == "gloo"
    # one GPU shared by actor rank 0 and the rollout worker: NCCL refuses two ranks on one device
    assert group_kind(["cuda:0 (H200, CUDA_VISIBLE_DEVICES=0)"] * 2) == "gloo"


def test_the_flag_is_checked_and_in_process_refuses_the_collective():
    from relax.algorithms import load_algorithm
    from relax.runtime.checks.validation import ConfigError, validate

    def errors(**kw) -> list[str]:
        with pytest.raises(ConfigError) as caught:
            validate(RunConfig(**kw), load_algorithm("grpo"))
        return caught.value.errors

    assert any("--weight-transport" in e and "nccl" in e for e in errors(weight_transport="nccl"))
    found = errors(weight_transport="collective", in_process=True)
    assert any("--in-process cannot run --weight-transport collective" in e for e in found), found


def test_buffers_of_sent_and_dropped_versions_are_reused_and_carry_the_new_bytes():
    """Rank 0 reuses a sent version's buffer, a rollout worker a dropped one's (no fresh allocation per
    publish); what arrives is still each version's weights bit for bit."""
    import time

    sender, (receiver,) = _connected(1)
    engine, where = _Engine(), {}
    for version in (1, 2, 3):
        state = _state(version)
        receiver.receive(sender.publish(state, version), engine)
        where[version] = receiver._kept[version][1].data_ptr()
        receiver.forget_older(version)  # the rollout samples with it: the older one's buffer is spare
        _assert_bit_identical(engine.loaded[-1], state)
    assert where[3] == where[1] != where[2]  # version 3 arrived in version 1's buffer
    deadline = time.monotonic() + 5
    while not sender._spares and time.monotonic() < deadline:  # the sender thread files it after the broadcast
        time.sleep(0.01)
    assert sender._spares, "rank 0 keeps a sent buffer for the next publish"
