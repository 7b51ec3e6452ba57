"""Rows at different lengths decoding as one batch: the KV store of the in-process backend's
batched decode (`parser.serving.backends.transformers`).

Why it exists: a scatter round sends T prompts that differ in length, arrive together and
leave one by one. transformers' `DynamicCache` holds one length for the whole batch, so a row
that joins or leaves means re-padding and copying every other row; transformers' own continuous
batching (5.10: `generation/continuous_batching/`) refuses linear-attention layers (Qwen3.5's
Gated DeltaNet) and offers neither per-request seeds, grammars nor stop strings. Here each row
owns a slot of preallocated per-layer buffers `[slots, kv_heads, capacity, head_dim]` and keeps
its own length; a decode step writes every row's new key at that row's own position and attends
over the longest row under a padding mask. A row joining copies itself in, a row leaving copies
itself out (and the last row moves into its slot); no other row moves. Linear-attention layers
keep one fixed-size state per slot.

    batch = SlotBatch(model.config, capacity=1024)
    batch.add(request, prefilled_cache, length)     # a DynamicCache for one prompt (batch size 1)
    logits = batch.step(model, [next_token_of_each_row])   # [rows, vocab], rows in batch.rows order
    logits = batch.step(model, [[*prompt_tail], token, ...])  # joined rows run their prompt's tail together
    request, cache = batch.pop(batch.rows.index(request))  # its DynamicCache again, to keep

Buffers are allocated empty (the OS backs pages only where they are written) and zeroed only up
to the longest row so far, so a masked position never holds NaN garbage and memory follows the
rows actually held, not the capacity.

Must never: be used for a model whose cache has other layer types (sliding windows): `batchable`
says so, and the backend then decodes such rows one at a time.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

try:  # transformers >= 5: linear-attention (recurrent) layers in the cache
    from transformers.cache_utils import LinearAttentionCacheLayerMixin, LinearAttentionLayer
except ImportError:  # pragma: no cover - older transformers: attention-only models batch
    LinearAttentionCacheLayerMixin = LinearAttentionLayer = ()  # type: ignore[assignment,misc]

GQA_SDPA = "parser_sdpa"  # the attention implementation `use_gqa_sdpa` installs


def batchable(config: Any) -> bool:
    """Whether rows of this model can share a `SlotBatch`: every cache layer full attention or
    linear attention (sliding windows forget what a per-row mask would need)."""
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) in (DynamicLayer, LinearAttentionLayer) for layer in layers)


def use_gqa_sdpa(model: Any) -> None:
    """Run `model`'s SDPA attention with grouped-query heads kept grouped under a mask, on CPU.

    transformers' `sdpa` repeats every K/V head once per query head whenever a mask is passed
    (`use_gqa_in_sdpa`), because CUDA's fused kernels take no mask with `enable_gqa`. A padded
    batch always passes a mask, and on CPU the repeat made a 14-row SmolLM2 decode step ~4x
    slower than the same step unmasked (measured: 0.63 s vs 0.16 s). torch's CPU kernels take
    `enable_gqa` with a mask, so on CPU it is used; elsewhere this is transformers' `sdpa`.
    Masks are built exactly as for `sdpa`."""
    if model.config._attn_implementation != "sdpa":
        return
    AttentionInterface.register(GQA_SDPA, _gqa_sdpa_forward)
    AttentionMaskInterface.register(GQA_SDPA, ALL_MASK_ATTENTION_FUNCTIONS.get("sdpa", sdpa_mask))
    model.set_attn_implementation(GQA_SDPA)


def _gqa_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    if attention_mask is None or query.device.type != "cpu" or getattr(module, "num_key_value_groups", 1) == 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if query.shape[2] == 1 and not dropout:
        return _decode_attention(query, key, value, attention_mask, scaling), None
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                      scaling: float | None) -> torch.Tensor:
    """One query per row (a decode step) as two batched matmuls, each K/V head serving its group
    of query heads: torch's CPU flash kernel is blocked over queries and spent 1.2 ms a layer on a
    14-row SmolLM2 step (a quarter of the step), for ~2.6 MB of K/V read."""
    rows, q_heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, q_heads // kv_heads, dim)  # query head h reads K/V head h // group
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)
    probs = torch.softmax(scores.float() + mask.float(), dim=-1).to(value.dtype)  # mask [rows, 1, 1, kv] broadcasts
    out = torch.matmul(probs, value)  # [rows, kv_heads, group, dim]
    return out.reshape(rows, q_heads, 1, dim).transpose(1, 2).contiguous()


class SlotBatch:
    """Rows decoding together, each at its own length; `rows` holds the caller's objects in
    slot order (it changes only through `add` and `pop`)."""

    def __init__(self, config: Any, capacity: int, zero_block: int = 256):
        self.config = config
        self.capacity = capacity  # positions one row may hold: its prompt plus its new tokens
        self.zero_block = zero_block
        self.rows: list[Any] = []
        self.lengths: list[int] = []  # positions each row holds
        self._layers: list[_SlotAttention | _SlotLinear] = []
        self._zeroed = 0  # positions [0, _zeroed) of every allocated slot hold finite values
        self._slots = 0
        self._positions = torch.zeros(0, dtype=torch.long)  # where this step writes each row
        self._row_ids = torch.zeros(0, dtype=torch.long)
        self.kv_len = 0  # positions the attention of the current step covers
        self.q_len = 1  # tokens each row feeds in the current step
        self.cache: Cache | None = None

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ rows in and out
    def add(self, row: Any, cache: DynamicCache, length: int) -> None:
        """Copy a one-prompt cache holding `length` positions into a free slot."""
        if length >= self.capacity:
            raise ValueError(f"SlotBatch: a row of {length} positions does not fit capacity {self.capacity}")
        if not self._layers:
            self._build(cache)
        if len(self.rows) == self._slots:
            self._grow(max(1, 2 * self._slots))
        self._zero_to(length)
        slot = len(self.rows)
        for mine, theirs in zip(self._layers, cache.layers, strict=True):
            mine.put(slot, theirs, length)
        self.rows.append(row)
        self.lengths.append(length)

    def pop(self, index: int) -> tuple[Any, DynamicCache]:
        """Remove row `index` and return it with a one-prompt cache of its positions; the last
        row moves into its slot."""
        row, length = self.rows[index], self.lengths[index]
        cache = DynamicCache(config=self.config)
        for mine, theirs in zip(self._layers, cache.layers, strict=True):
            mine.take(index, theirs, length)
        last = len(self.rows) - 1
        if index != last:
            for layer in self._layers:
                layer.move(last, index, self.lengths[last])
            self.rows[index], self.lengths[index] = self.rows[last], self.lengths[last]
        self.rows.pop()
        self.lengths.pop()
        if not self.rows:
            self._release()
        return row, cache

    # ------------------------------------------------------------------ one decode step
    def step(self, model: Any, tokens: list[int] | list[list[int]]) -> torch.Tensor:
        """Feed each row its next token — or a list of tokens: the tail of a prompt whose prefix
        the row joined with (`add`), run for all such rows in this one forward (attention-only
        models; shorter rows are padded, their padding written past their end and never seen).
        Returns the logits after each row's last token, one row per row."""
        seqs = [list(t) if isinstance(t, (list, tuple)) else [t] for t in tokens]
        n = len(self.rows)
        if len(seqs) != n or not all(seqs):
            raise ValueError(f"SlotBatch.step: {len(seqs)} token lists (each non-empty) for {n} rows")
        q = max(len(seq) for seq in seqs)
        if q > 1 and any(isinstance(layer, _SlotLinear) for layer in self._layers):
            raise ValueError("SlotBatch.step: several tokens per row need attention-only layers")
        device = self._device
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        sizes = torch.tensor([len(seq) for seq in seqs], dtype=torch.long)
        self.kv_len = int((lengths + sizes).max())
        if self.kv_len > self.capacity:
            raise ValueError(f"SlotBatch: a row outgrew its capacity {self.capacity}")
        self.q_len = q
        self._zero_to(self.kv_len)
        offsets = torch.arange(q)[None, :]
        # a padding token is written past its row's end (clamped into the buffer): a position
        # becomes visible to a row only after the row wrote it, so the garbage is never read
        self._positions = (lengths[:, None] + offsets).clamp(max=self.capacity - 1).to(device)
        self._row_ids = torch.arange(n, device=device)
        mask = None
        if q > 1 or int(lengths.min()) + 1 != self.kv_len:  # causal over the tails, each row's own length
            last = lengths[:, None] + torch.minimum(offsets, sizes[:, None] - 1)  # [n, q]: the last position each query sees
            visible = torch.arange(self.kv_len)[None, None, :] <= last[:, :, None]
            mask = torch.zeros(n, 1, q, self.kv_len, dtype=self._dtype)
            mask.masked_fill_(~visible[:, None], torch.finfo(self._dtype).min)
            mask = mask.to(device)
        ids = torch.tensor([seq + [seq[-1]] * (q - len(seq)) for seq in seqs], dtype=torch.long, device=device)
        wanted = sorted({len(seq) - 1 for seq in seqs})  # the query positions whose logits are kept
        out = model(input_ids=ids, position_ids=self._positions, attention_mask=mask, past_key_values=self.cache,
                    use_cache=True, logits_to_keep=1 if q == 1 else torch.tensor(wanted, device=device))
        self.lengths = [length + len(seq) for length, seq in zip(self.lengths, seqs, strict=True)]
        if q == 1:
            return out.logits[:, -1].float()
        column = torch.tensor([wanted.index(len(seq) - 1) for seq in seqs], device=device)
        return out.logits[torch.arange(n, device=device), column].float()

    # ------------------------------------------------------------------ buffers
    def _build(self, cache: DynamicCache) -> None:
        first = next((layer for layer in cache.layers if isinstance(layer, DynamicLayer)), None)
        states = next((layer for layer in cache.layers if not isinstance(layer, DynamicLayer)), None)
        sample = first.keys if first is not None else (states.conv_states if states.conv_states is not None
                                                        else states.recurrent_states)
        self._dtype, self._device = sample.dtype, sample.device
        self._layers = [_SlotAttention(self, layer) if isinstance(layer, DynamicLayer) else _SlotLinear(self, layer)
                        for layer in cache.layers]
        self.cache = Cache(layers=self._layers)

    def _grow(self, slots: int) -> None:
        for layer in self._layers:
            layer.grow(slots, self._zeroed)
        self._slots = slots

    def _zero_to(self, length: int) -> None:
        if length <= self._zeroed:
            return
        upto = min(self.capacity, -(-length // self.zero_block) * self.zero_block)
        for layer in self._layers:
            layer.zero(self._zeroed, upto)
        self._zeroed = upto

    def _release(self) -> None:
        """No rows left: give the buffers back (the next row allocates afresh)."""
        self._layers, self.cache, self._slots, self._zeroed = [], None, 0, 0


class _SlotAttention(CacheLayerMixin):
    """One attention layer's K/V for every slot; `update` writes each row at its own position."""

    is_sliding = False

    def __init__(self, batch: SlotBatch, like: DynamicLayer):
        super().__init__()
        self.batch = batch
        _, self.heads, _, self.k_dim = like.keys.shape
        self.v_dim = like.values.shape[-1]
        self.dtype, self.device = like.keys.dtype, like.keys.device
        self.keys = self.values = torch.empty(0, self.heads, batch.capacity, self.k_dim, dtype=self.dtype)
        self.is_initialized = True

    def grow(self, slots: int, zeroed: int) -> None:
        old_k, old_v = self.keys, self.values
        self.keys = torch.empty(slots, self.heads, self.batch.capacity, self.k_dim, dtype=self.dtype, device=self.device)
        self.values = torch.empty(slots, self.heads, self.batch.capacity, self.v_dim, dtype=self.dtype, device=self.device)
        kept = old_k.shape[0]
        self.keys[:kept, :, :zeroed] = old_k[:, :, :zeroed]
        self.values[:kept, :, :zeroed] = old_v[:, :, :zeroed]
        self.keys[kept:, :, :zeroed] = 0
        self.values[kept:, :, :zeroed] = 0

    def zero(self, start: int, stop: int) -> None:
        self.keys[:, :, start:stop] = 0
        self.values[:, :, start:stop] = 0

    def put(self, slot: int, layer: DynamicLayer, length: int) -> None:
        self.keys[slot, :, :length] = layer.keys[0, :, :length]
        self.values[slot, :, :length] = layer.values[0, :, :length]

    def take(self, slot: int, layer: DynamicLayer, length: int) -> None:
        layer.lazy_initialization(self.keys[:1, :, :0], self.values[:1, :, :0])
        layer.keys = self.keys[slot:slot + 1, :, :length].clone()
        layer.values = self.values[slot:slot + 1, :, :length].clone()

    def move(self, src: int, dst: int, length: int) -> None:
        self.keys[dst, :, :length] = self.keys[src, :, :length]
        self.values[dst, :, :length] = self.values[src, :, :length]

    # --- what the model's attention calls
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[0]
        rows, positions = self.batch._row_ids, self.batch._positions  # [n], [n, q]
        if key_states.shape[2] != positions.shape[1]:
            raise ValueError(f"SlotBatch: {key_states.shape[2]} new positions per row, the step planned {positions.shape[1]}")
        self.keys[rows[:, None], :, positions] = key_states.transpose(1, 2)
        self.values[rows[:, None], :, positions] = value_states.transpose(1, 2)
        return self.keys[:n, :, :self.batch.kv_len], self.values[:n, :, :self.batch.kv_len]

    def get_seq_length(self) -> int:
        return max(self.batch.kv_len - self.batch.q_len, 0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.batch.kv_len, 0

    def get_max_cache_shape(self) -> int:
        return self.batch.capacity


class _SlotLinear(LinearAttentionCacheLayerMixin):
    """One linear-attention layer's fixed-size states for every slot; the model reads and updates
    the running rows' states in place through `conv_states` / `recurrent_states`."""

    def __init__(self, batch: SlotBatch, like: Any):  # noqa: D107 - the mixin's __init__ would set the states to None
        self.batch = batch
        self.has_previous_state = True
        self.is_conv_states_initialized = like.is_conv_states_initialized
        self.is_recurrent_states_initialized = like.is_recurrent_states_initialized
        self._shapes = {name: tuple(getattr(like, name).shape[1:]) for name in ("conv_states", "recurrent_states")
                        if getattr(like, name) is not None}
        sample = getattr(like, next(iter(self._shapes)))
        self.dtype, self.device = sample.dtype, sample.device
        self._buffers = {name: torch.empty(0, *shape, dtype=self.dtype, device=self.device)
                         for name, shape in self._shapes.items()}

    @property
    def conv_states(self) -> torch.Tensor | None:
        return self._view("conv_states")

    @property
    def recurrent_states(self) -> torch.Tensor | None:
        return self._view("recurrent_states")

    def _view(self, name: str) -> torch.Tensor | None:
        buffer = self._buffers.get(name)
        return None if buffer is None else buffer[:len(self.batch.rows)]

    def grow(self, slots: int, zeroed: int) -> None:
        for name, old in self._buffers.items():
            new = torch.zeros(slots, *self._shapes[name], dtype=self.dtype, device=self.device)
            new[:old.shape[0]] = old
            self._buffers[name] = new

    def zero(self, start: int, stop: int) -> None:
        pass  # fixed-size states: nothing grows with the positions

    def put(self, slot: int, layer: Any, length: int) -> None:
        for name, buffer in self._buffers.items():
            buffer[slot] = getattr(layer, name)[0]

    def take(self, slot: int, layer: Any, length: int) -> None:
        for name, buffer in self._buffers.items():
            layer.lazy_initialization(**{name: buffer[slot:slot + 1]})
            getattr(layer, name).copy_(buffer[slot:slot + 1])
        layer.has_previous_state = True

    def move(self, src: int, dst: int, length: int) -> None:
        for buffer in self._buffers.values():
            buffer[dst] = buffer[src]

    # --- what the model's linear attention calls
    def lazy_initialization(self, conv_states: torch.Tensor | None = None,
                            recurrent_states: torch.Tensor | None = None) -> None:
        pass

    def update_conv_state(self, conv_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        view = self.conv_states
        view.copy_(conv_states[..., -view.shape[-1]:])
        return view

    def update_recurrent_state(self, recurrent_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        view = self.recurrent_states
        view.copy_(recurrent_states)
        return view


class SoloRows:
    """`SlotBatch`'s interface for models it cannot hold (sliding-window layers): each row keeps
    its own `DynamicCache` and a step runs one forward per row."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self._caches: list[DynamicCache] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Any, cache: DynamicCache, length: int) -> None:
        self.rows.append(row)
        self._caches.append(cache)

    def pop(self, index: int) -> tuple[Any, DynamicCache]:
        return self.rows.pop(index), self._caches.pop(index)

    def step(self, model: Any, tokens: list[int]) -> torch.Tensor:
        device = next(model.parameters()).device
        return torch.stack([
            model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache, use_cache=True,
                  logits_to_keep=1).logits[0, -1].float()
            for token, cache in zip(tokens, self._caches, strict=True)])
