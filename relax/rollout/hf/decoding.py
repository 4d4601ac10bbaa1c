"""How ``HFEngine`` runs the model for one generation: a prefill over the prompts, then one
single-token step per new token. Two implementations with the same inputs and outputs:

- ``DynamicDecoding``: transformers' growing cache (``DynamicCache``); every step is an eager forward
  whose attention mask has grown by one column. The CPU default, unchanged since the engine's start.
- ``StaticDecoding``: a preallocated ``StaticCache`` per (batch, length) *bucket*, so that every decode
  step of a bucket has the same shapes and reads and writes the same tensors. On CUDA the step is then
  captured once per bucket as a CUDA graph and replayed: one launch per token instead of several
  hundred kernel launches, which is what bounds a small model's decoding on a GPU (the 0.5B model of
  ``benchmarks/hf_rollout.py`` spent ~28 ms per step, the GPU busy ~7 % of it).

Why a hand-captured CUDA graph rather than ``torch.compile(mode="reduce-overhead")``: both need the
static cache; the graph replays the very kernels the eager step runs (the same numbers, and the CPU
test of the eager static path covers everything but the capture), its capture costs three eager
steps per bucket, while compiling a model costs tens of seconds per shape on the rollout worker's
first step and depends on how Dynamo traces each transformers release. Sampling (temperature,
top-p, the log-probs) stays outside the graph, eager, exactly as in the dynamic path.

Layout of a bucket: cache slot ``j`` holds the key/value of column ``j`` of the engine's attention
buffer (prompt columns ``0..P-1``, response token ``t`` at ``P + t``); the batch and the length are
rounded up (``BATCH_MULTIPLE``, ``LENGTH_MULTIPLE``) so that nearby shapes share a graph. Rows past
the real batch are filler: pad tokens attending to each other, never read.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

BATCH_MULTIPLE = 8
LENGTH_MULTIPLE = 64
MAX_BUCKETS = 4  # captured graphs (and their caches) kept alive at once; the oldest goes first


class GraphCaptureError(RuntimeError):
    """The decode step could not be captured as a CUDA graph (the engine falls back to eager)."""


class DynamicDecoding:
    """Eager decoding over transformers' growing cache (the engine's original loop)."""

    name = "dynamic cache"

    def __init__(self, model: torch.nn.Module, call):
        self.model, self._call = model, call
        self._cache = None

    def begin(self, n: int, width: int, max_new_tokens: int) -> None:
        self._cache = None

    def prefill(self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits, self._cache = self._call(
            self.model, None, input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=1
        )
        return logits[:, -1, :]

    def step(self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits, self._cache = self._call(
            self.model, self._cache, input_ids=tokens[:, None], attention_mask=attention,
            position_ids=positions[:, None],
        )
        return logits[:, -1, :]


def static_decoding_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``StaticDecoding`` cannot run ``model`` (None: it can). It builds its own attention
    masks, which it knows how to do for full attention under SDPA or eager attention only."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        return f"attention implementation {implementation!r} (static decoding supports sdpa and eager)"
    try:
        from transformers.cache_utils import StaticCache, StaticLayer
    except ImportError as exc:  # pragma: no cover - every transformers 5.x has both
        return f"transformers has no StaticCache ({exc})"
    layers = StaticCache(config=model.config, max_cache_len=1).layers
    if any(type(layer) is not StaticLayer for layer in layers):
        return "the model has sliding-window or other non-full attention layers"
    return None


class _Bucket:
    """One (batch, length) shape: its static cache, the decode step's input buffers and, on CUDA,
    the captured step and its output."""

    def __init__(self, model, batch: int, length: int, pad_id: int, device: torch.device):
        from transformers.cache_utils import StaticCache

        self.batch, self.length = batch, length
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.ids = torch.full((batch, 1), pad_id, dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.attend = torch.zeros((batch, length), dtype=torch.bool, device=device)  # True: attend to slot
        self.attend[:, 0] = True
        self.mask = _attention_mask(model, self.attend)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the graph's output, overwritten by every replay
        self.weights_at_capture: tuple[int, ...] = ()


def _attention_mask(model, attend: torch.Tensor) -> torch.Tensor:
    """The 4-D mask ``[B, 1, 1, L]`` the attention implementation takes as given: booleans for SDPA,
    0 / most-negative additive values for eager attention."""
    mask = attend[:, None, None, :]
    if model.config._attn_implementation == "sdpa":
        return mask.clone()
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


class StaticDecoding:
    """Decoding over a preallocated ``StaticCache``; with ``cuda_graphs`` each bucket's decode step
    is captured once and replayed (CUDA only)."""

    def __init__(self, model: torch.nn.Module, call, *, pad_id: int, cuda_graphs: bool):
        self.model, self._call, self.pad_id = model, call, pad_id
        self.device = next(model.parameters()).device
        self.cuda_graphs = cuda_graphs
        self.name = "static cache + CUDA graphs" if cuda_graphs else "static cache"
        self._buckets: OrderedDict[tuple[int, int], _Bucket] = OrderedDict()
        self._bucket: _Bucket | None = None
        self._n = 0

    # -- one generation --
    def begin(self, n: int, width: int, max_new_tokens: int) -> None:
        shape = (_round_up(n, BATCH_MULTIPLE), _round_up(width + max_new_tokens, LENGTH_MULTIPLE))
        bucket = self._buckets.pop(shape, None) or _Bucket(self.model, *shape, self.pad_id, self.device)
        self._buckets[shape] = bucket  # most recently used last
        while len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        if self.cuda_graphs and max_new_tokens > 1 and (
            bucket.graph is None or bucket.weights_at_capture != self._weight_addresses()
        ):
            self._capture(bucket)
        bucket.cache.reset()
        self._bucket, self._n = bucket, n

    def prefill(self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Fills cache slots ``0..P-1`` (eagerly: prompts vary in width, so this is not captured)."""
        b, n, width = self._bucket, self._n, ids.shape[1]
        full_ids = torch.full((b.batch, width), self.pad_id, dtype=torch.long, device=self.device)
        full_ids[:n] = ids
        full_positions = torch.zeros((b.batch, width), dtype=torch.long, device=self.device)
        full_positions[:n] = positions
        full_attention = torch.zeros((b.batch, b.length), dtype=torch.long, device=self.device)
        full_attention[:n, :width] = attention
        full_attention[n:, :width] = 1  # filler rows attend to their own pad tokens: no row is fully masked
        logits, _ = self._call(
            self.model, b.cache, input_ids=full_ids, attention_mask=full_attention, position_ids=full_positions,
            logits_to_keep=1,
        )
        b.attend.zero_()
        b.attend[n:, :width] = True
        return logits[:n, -1, :]

    def step(self, tokens: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per row into the next cache slot; ``attention`` ``[n, P + t + 1]`` says which
        slots each row attends to (the one being written included)."""
        b, n = self._bucket, self._n
        b.ids[:n, 0] = tokens
        b.positions[:n, 0] = positions
        b.attend[:n, : attention.shape[1]] = attention.bool()
        _write_mask(b)
        if b.graph is not None:
            b.graph.replay()
            return b.logits[:n]
        return self._forward(b)[:n]

    # -- the captured step --
    def _forward(self, b: _Bucket) -> torch.Tensor:
        with _grouped_query_decode_attention():
            logits, _ = self._call(
                self.model, b.cache, input_ids=b.ids, attention_mask=b.mask, position_ids=b.positions
            )
        return logits[:, -1, :]

    def _weight_addresses(self) -> tuple[int, ...]:
        # A graph reads the parameters at the addresses they had at capture: load_weights copies in
        # place, but anything that replaced a tensor makes the graph stale, so it is captured again.
        return tuple(p.data_ptr() for p in self.model.parameters())

    def _capture(self, b: _Bucket) -> None:
        try:
            with torch.cuda.device(self.device):
                self._capture_on_device(b)
        except Exception as exc:  # noqa: BLE001 - any failure means: decode without graphs
            raise GraphCaptureError(f"{type(exc).__name__}: {exc}") from exc
        b.weights_at_capture = self._weight_addresses()

    def _capture_on_device(self, b: _Bucket) -> None:
        b.graph, b.logits = None, None
        b.ids.fill_(self.pad_id)
        b.positions.zero_()
        b.attend.zero_()
        b.attend[:, 0] = True
        _write_mask(b)
        b.cache.reset()
        self._forward(b)  # allocates the cache (lazily, on its first write) outside the capture
        # Warm-up on a side stream before capturing, as torch.cuda.graph asks (library handles,
        # allocator state); the cache writes of these steps are wiped by reset() in begin().
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads of the worker (heartbeats, the data plane) may use CUDA meanwhile
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            logits = self._forward(b)
        torch.cuda.synchronize(self.device)
        b.graph, b.logits = graph, logits


@contextlib.contextmanager
def _grouped_query_decode_attention():
    """transformers' SDPA attention, except for one new token per row over a grouped-query cache.

    With an explicit mask, transformers repeats every key/value head of the whole cache once per
    query head sharing it before calling SDPA (on the H200 that copy was the largest kernel of the
    0.5B model's decode step, 1.2 of its 4.8 ms). With a single query position, the query heads
    that share a key/value head can instead be that head's queries: the same attention, no copy.
    Installed only around the decode step's forward (the graph keeps the kernels, not the Python)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        batch, heads, length, dim = query.shape
        kv_heads = key.shape[1]
        if length != 1 or heads == kv_heads or attention_mask is None or attention_mask.dim() != 4 or dropout:
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # head h reads kv head h // group
        out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None

    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa


def _write_mask(b: _Bucket) -> None:
    if b.mask.dtype == torch.bool:
        b.mask[:, 0, 0, :].copy_(b.attend)
    else:
        additive = torch.zeros_like(b.mask[:, 0, 0, :]).masked_fill_(~b.attend, torch.finfo(b.mask.dtype).min)
        b.mask[:, 0, 0, :].copy_(additive)


def _round_up(value: int, multiple: int) -> int:
    return max(math.ceil(value / multiple), 1) * multiple
