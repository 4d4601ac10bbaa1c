"""Rank function for ``test_megatron_speed_paths.py`` (module level, so spawn can pickle it): the CPU
step-time shortcuts of the Megatron backend against the megatron-core code they stand in for.

It runs in a spawned process because ``_cpu_compat.apply()`` patches process-wide state.
"""

from __future__ import annotations

import torch

import megatron_workers as W


def speed_paths(rank: int, world: int) -> dict:
    from megatron.core import utils

    from relax.backends.megatron import _cpu_compat

    out = {}
    # -- the foreach stand-ins for megatron-core's pure-Python multi-tensor fallbacks ------------
    _cpu_compat.apply()
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(shape, generator=g) * s for shape, s in
               (((17, 64), 0.3), ((64,), 2.0), ((192, 64), 1e-3), ((3,), 50.0), ((64, 256), 0.07))]
    with _cpu_compat.cpu_device_scope():  # the originals allocate a literal CUDA tensor
        expected_norm, _ = utils.local_multi_tensor_l2_norm(65536, None, [tensors], False)
        got_norm, _ = _cpu_compat._foreach_l2_norm(65536, None, [tensors], False)
        expected_scaled = [t.clone() for t in tensors]
        utils.local_multi_tensor_scale(65536, None, [tensors, expected_scaled], 0.3719)
        got_scaled = [t.clone() for t in tensors]
        _cpu_compat._foreach_scale(65536, None, [tensors, got_scaled], 0.3719)
        into_bf16 = [torch.empty_like(t, dtype=torch.bfloat16) for t in tensors]
        _cpu_compat._foreach_scale(65536, None, [tensors, into_bf16], 1.0)
    out["norms"] = (expected_norm, got_norm)
    out["scaled"] = (expected_scaled, got_scaled)
    out["into_bf16_exact"] = all(torch.equal(b, t.bfloat16()) for b, t in zip(into_bf16, tensors))
    from megatron.core.optimizer import clip_grads, optimizer

    out["patched"] = (clip_grads.l2_norm_impl is _cpu_compat._foreach_l2_norm,
                      clip_grads.multi_tensor_scale_impl is _cpu_compat._foreach_scale,
                      optimizer.multi_tensor_scale_impl is _cpu_compat._foreach_scale)

    # -- the inline PP=1 loop against megatron-core's schedule, and the unscoped inner step ------
    batch = W.make_batch()
    runs = {}
    for name in ("inline", "schedule"):
        backend = W._megatron()
        modes = []  # the innermost function mode while the inner torch.optim step runs
        for inner in backend._torch_optimizers():
            inner.register_step_pre_hook(
                lambda *_: modes.append(type(torch.overrides._get_current_function_mode()).__name__))
        if name == "schedule":
            backend._unpipelined_applies = lambda: False
        run = W.run_training(backend, batch)
        run["grads"] = backend.gradients()
        run["trained"] = backend.export_weights()
        run["exp_avg_sq"] = backend._gather(backend._adam_state("exp_avg_sq"))
        run["log_probs_after"] = backend.compute_log_probs(batch, with_entropy=True)
        run["modes"] = modes
        runs[name] = run
        del backend
        W._reset_parallel_state()
    out["runs"] = runs

    # the wrapper itself: pops the device scope for the wrapped call, and only that scope
    seen = []
    wrapped = _cpu_compat._unscoped(lambda: seen.append(torch.overrides._get_current_function_mode()))
    with _cpu_compat.cpu_device_scope():
        wrapped()
        seen.append(torch.overrides._get_current_function_mode())
    out["unscoped_modes"] = [type(m).__name__ for m in seen]
    out["linear"] = plain_linear_against_megatron()
    out["attention"] = sdpa_against_megatron()
    return out


def sdpa_against_megatron() -> dict:
    """``SdpaDotProductAttention`` against megatron-core's ``DotProductAttention`` (same config, same
    inputs): outputs and query/key/value gradients, for multi-head and grouped-query attention, with
    relax's mask (causal, left padding, every query sees itself). Returns the largest relative
    difference per number of key/value groups."""
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from relax.backends.megatron.attention import sdpa_core_attention_class
    from relax.backends.megatron.process_groups import init_parallel_state

    init_parallel_state(1, 1, 0)
    s, b, heads, head_dim = 7, 3, 4, 8
    idx = torch.arange(s)
    key_valid = torch.ones(b, s, dtype=torch.bool)
    key_valid[0, :2] = False  # row 0 is left-padded by two tokens
    allowed = ((idx[None, :] <= idx[:, None]) & key_valid[:, None, :]) | torch.eye(s, dtype=torch.bool)
    mask = ~allowed[:, None]  # [b, 1, s, s], True where masked
    diffs = {}
    try:
        for groups in (heads, 2):
            cfg = TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                                    num_query_groups=groups, kv_channels=head_dim, attention_dropout=0.0,
                                    hidden_dropout=0.0, use_cpu_initialization=True)
            g = torch.Generator().manual_seed(groups)
            inputs = (torch.randn(s, b, heads, head_dim, generator=g), torch.randn(s, b, groups, head_dim, generator=g),
                      torch.randn(s, b, groups, head_dim, generator=g))
            upstream = torch.randn(s, b, heads * head_dim, generator=g)
            results = {}
            for name, cls in (("megatron", DotProductAttention), ("sdpa", sdpa_core_attention_class())):
                module = cls(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
                q, k, v = (t.clone().requires_grad_(True) for t in inputs)
                y = module(q, k, v, mask)
                y.backward(upstream)
                results[name] = [y.detach(), q.grad, k.grad, v.grad]
            diffs[groups] = max(float((a - m).abs().max() / m.abs().max())
                                for a, m in zip(results["sdpa"], results["megatron"]))
    finally:
        W._reset_parallel_state()
    return diffs


def plain_linear_against_megatron() -> dict:
    """``_cpu_compat._plain_linear`` (``F.linear``) against megatron-core's autograd function on a
    ``[s, b, h]`` input, with and without bias: outputs and all three gradients; and which calls it
    hands back to the original (anything with a gradient all-reduce or sequence parallelism)."""
    from megatron.core.tensor_parallel import layers

    from relax.backends.megatron import _cpu_compat

    g = torch.Generator().manual_seed(11)
    x0, w0, b0 = torch.randn(13, 6, 32, generator=g), torch.randn(48, 32, generator=g) * 0.2, torch.randn(48, generator=g)
    upstream = torch.randn(13, 6, 48, generator=g)
    results = {}
    for name, fn in (("plain", _cpu_compat._plain_linear),
                     ("megatron", layers.LinearWithGradAccumulationAndAsyncCommunication.apply)):
        for with_bias in (True, False):
            x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
            args = (x, w, b if with_bias else None, False, False, False)
            y = fn(*args) if name == "plain" else fn(*args, None, None, None)
            y.backward(upstream)
            results[(name, with_bias)] = [y.detach(), x.grad, w.grad] + ([b.grad] if with_bias else [])
    diffs = {with_bias: max(float((a - m).abs().max() / m.abs().max())
                            for a, m in zip(results[("plain", with_bias)], results[("megatron", with_bias)]))
             for with_bias in (True, False)}
    calls = []
    original = _cpu_compat._ORIGINAL_FALLBACKS["linear"]
    _cpu_compat._ORIGINAL_FALLBACKS["linear"] = lambda *args: calls.append(args[3:6]) or "original"
    try:
        handed_back = [_cpu_compat._plain_linear(x0, w0, None, *flags) == "original"
                       for flags in ((True, False, False), (False, True, False), (False, False, True))]
    finally:
        _cpu_compat._ORIGINAL_FALLBACKS["linear"] = original
    return {"max_rel_diff": diffs, "handed_back": handed_back, "calls": calls,
            "installed": layers.linear_with_grad_accumulation_and_async_allreduce is _cpu_compat._plain_linear}
