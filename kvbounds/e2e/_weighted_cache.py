"""A transformers cache that holds a compressed KV cache with its per-token log-weights, safe inside ``generate``.

The contract (:class:`kvbounds.algorithms.token_selection.CompressedKV`): a layer's compressed cache
is ``(K', V', a, b)`` per KV head and attention over it is

    o(q) = sum_i exp(l_i + a_i) v_i / sum_i exp(l_i + b_i),    l_i = <q, k_i> * scale,

a = log_w_num, b = log_w_den (-inf drops a token from one side; both -inf is padding). Tokens appended after
compression get a = b = 0. The weights live in :class:`WeightedLayer` beside K' and V', so every cache operation
``generate`` performs (``reorder_cache`` for beam search, ``batch_select_indices``, ``batch_repeat_interleave``,
``crop``) moves them with the keys.

Two lengths, both public: :attr:`WeightedLayer.logical_length` (tokens seen: the compressed prompt's and every
token appended since) and :attr:`WeightedLayer.stored_length` (tokens held: ``keys.shape[-2]``). ``get_seq_length``
reports the logical one, as transformers' own sliding-window layers do (``generate`` then feeds only the tokens
after the prompt and places them at their true positions), and ``get_mask_sizes`` tells the mask builder the
offset between the two. kvpress's ``"kv-press-text-generation"`` pipeline cuts each answer off by slicing the
stored keys at the length it read from ``get_seq_length``, which is right only for an uncompressed layer;
:func:`kvbounds.e2e.pipeline` (or kvpress's own inside :func:`kvbounds.e2e.weighted_answers`) makes its cut a
:meth:`WeightedLayer.crop` to that logical length for
these layers (installed by :mod:`kvbounds.presses` and :mod:`kvbounds.presses`).

The Cache API of transformers 5.2 and of the newest 5.x both work: ``get_mask_sizes`` takes the cache positions
(5.2) or the query length (later), ``crop`` a final logical length (5.2) or a negative count of tokens to remove
(both), and ``update`` passes any extra arguments through.

Hand-off to the attention: ``update`` returns the keys it holds with the layer attached
(attribute ``_kvbounds_layer``); :func:`kvbounds.e2e._attention.weighted_attention_forward` reads and removes
it. If the model's attention implementation does not read it (e.g. ``sdpa``), the next ``update`` of the cache
finds it still there and raises :class:`ModelNotWeighted` instead of letting the weights be ignored.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from kvbounds.algorithms.validation import InputError

HANDOFF = "_kvbounds_layer"


class ModelNotWeighted(InputError):
    """The model's attention implementation ignored a weighted cache's log-weights."""


def not_weighted_message() -> str:
    from ._attention import ATTN_IMPLEMENTATION
    return ("the model's attention implementation ignored the cache's log-weights (a weighted cache needs "
            f"attn_implementation={ATTN_IMPLEMENTATION!r}: kvbounds.e2e.load_model, or "
            f"kvbounds.e2e.use_weighted_attention(model))")


def visible_tokens(mask, b: int, n: int, device):
    """(b, n) bool: the last n tokens each row attends to, read from its last query's row of a 4-d attention mask
    (bool: True = visible; float: 0 = visible); all of them without a mask."""
    if mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=device)
    last = mask[:, 0, -1, -n:]
    vis = last if last.dtype == torch.bool else last == 0
    return vis.expand(b, n)


def check_log_weights(lw, name: str, shape: tuple) -> torch.Tensor:
    """float32 log-weights of ``shape`` (b, Hkv, m): finite or -inf; NaN / +inf raise :class:`InputError`.
    They are stored in float32 whatever their dtype (a float64 cache attends with float32-rounded weights)."""
    if not isinstance(lw, torch.Tensor):
        raise InputError(f"{name} must be a torch tensor, got {type(lw).__name__}")
    if tuple(lw.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {tuple(shape)} (batch, KV heads, kept tokens), got {tuple(lw.shape)}")
    lw = lw.float()
    if not bool((torch.isfinite(lw) | (lw == -math.inf)).all()):
        raise InputError(f"{name} contains NaN or +inf (only -inf, 'not used on this side', is allowed)")
    return lw


class WeightedLayer(DynamicLayer):
    """One layer's cache: ``keys``/``values`` (b, Hkv, m, d), ``log_w_num``/``log_w_den`` (b, Hkv, m) float32
    (None: all zero, exact attention), and ``dropped``, the tokens seen but not stored
    (:attr:`logical_length` = dropped + :attr:`stored_length`). Tokens appended by ``update`` get weight 0 on both
    sides; ``compressed_length`` tokens (the compressed cache) can never be cropped away."""

    def __init__(self, keys=None, values=None, log_w_num=None, log_w_den=None, *, logical_length: int | None = None):
        super().__init__()
        self.log_w_num = self.log_w_den = None
        self.dropped = 0
        self.compressed_length = 0        # tokens stored at the last compression (never cropped away)
        self._split = None                # (c, [V e^{a-c}, e^{b-c}]) for split weights, built on first use
        self._pending = None              # the key tensor of the last weighted hand-off, until the attention reads it
        if keys is None:
            return
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)) or keys.ndim != 4 \
                or values.shape[:-1] != keys.shape[:-1]:
            raise InputError("keys/values must be torch tensors (batch, KV heads, tokens, head_dim) agreeing in all "
                             f"but the last dimension, got {getattr(keys, 'shape', keys)} and "
                             f"{getattr(values, 'shape', values)}")
        for name, x in (("keys", keys), ("values", values)):
            if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
                raise InputError(f"{name} must be a real floating-point tensor with finite entries, got {x.dtype}"
                                 + ("" if not x.is_floating_point() else " with NaN or inf"))
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        m = self.compressed_length = int(keys.shape[-2])
        if logical_length is not None:
            if int(logical_length) < m:
                raise InputError(f"logical_length = {logical_length} is less than the {m} tokens stored")
            self.dropped = int(logical_length) - m
        if (log_w_num is None) != (log_w_den is None):
            raise InputError("give both log_w_num and log_w_den, or neither (exact attention)")
        if log_w_num is not None:
            shape = tuple(keys.shape[:-1])
            a = check_log_weights(log_w_num, "log_w_num", shape).to(keys.device)
            b = check_log_weights(log_w_den, "log_w_den", shape).to(keys.device)
            if m and bool((b == -math.inf).all(-1).any()):
                raise InputError("log_w_den is -inf for every stored token of some (batch, head): that head's "
                                 "denominator would rest on the new tokens alone")
            if bool((a != 0).any() | (b != 0).any()):
                self.log_w_num, self.log_w_den = a, (a if torch.equal(a, b) else b)   # shared: one SDPA bias

    @property
    def weighted(self) -> bool:
        return self.log_w_num is not None

    @property
    def split(self) -> bool:
        """Numerator and denominator weights differ (SubGen, the released walk); equal ones share one tensor."""
        return self.weighted and self.log_w_den is not self.log_w_num

    def split_values(self):
        """For split weights: the bias c = max(a, b) (b, Hkv, M) and the values augmented by one column,
        [V e^{a-c}, e^{b-c}] (b, Hkv, M, d+1), that the attention's single SDPA call reads. Kept beside the cache
        (one more copy of V for these layers) and extended by ``update``, so a decode step does not rebuild it."""
        if self._split is None:
            a, b = self.log_w_num, self.log_w_den
            c = torch.maximum(a, b)
            live = torch.isfinite(c)
            c0 = c.where(live, 0)
            fa = torch.where(live, torch.exp(a - c0), 0).to(self.values.dtype)
            fb = torch.where(live, torch.exp(b - c0), 0).to(self.values.dtype)
            self._split = (c, torch.cat([self.values * fa[..., None], fb[..., None]], -1))
        return self._split

    @property
    def logical_length(self) -> int:
        """Tokens this layer stands for: every token seen, stored or compressed away (``get_seq_length``)."""
        return self.dropped + self.stored_length

    @property
    def stored_length(self) -> int:
        """Tokens this layer holds now (keys.shape[-2]): what an attention call reads."""
        return 0 if self.keys is None or not self.is_initialized else int(self.keys.shape[-2])

    def update(self, key_states, value_states, *args, **kwargs):
        if self._pending is not None and hasattr(self._pending, HANDOFF):
            raise ModelNotWeighted(not_weighted_message())
        if self.weighted and self.log_w_num.shape[-1] != self.stored_length:
            raise InputError(f"this layer's keys were replaced from outside: it stores {self.stored_length} tokens "
                             f"but holds {self.log_w_num.shape[-1]} log-weights (crop a weighted layer with its own "
                             "crop())")
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.weighted:
            z = key_states.new_zeros(tuple(key_states.shape[:-1]), dtype=torch.float32)
            shared = self.log_w_den is self.log_w_num     # equal weights stay one tensor (one SDPA bias)
            self.log_w_num = torch.cat([self.log_w_num, z], -1)
            self.log_w_den = self.log_w_num if shared else torch.cat([self.log_w_den, z], -1)
            if self._split is not None:      # new tokens: c = 0, factors 1
                c, va = self._split
                one = value_states.new_ones(tuple(value_states.shape[:-1]) + (1,))
                self._split = (torch.cat([c, z], -1), torch.cat([va, torch.cat([value_states, one], -1)], -2))
        if self.weighted or self.dropped:
            setattr(keys, HANDOFF, self)
            self._pending = keys if self.weighted else None
        return keys, values

    def get_seq_length(self) -> int:
        """The logical length (see the module docstring): tokens seen, not tokens stored."""
        return self.logical_length

    def get_mask_sizes(self, queries):
        """The mask covers the stored keys plus the queries; ``kv_offset`` = dropped maps them to their logical
        positions, so the queries' causal and padding columns are right (the stored prefix is read from the
        weights, see :func:`kvbounds.e2e._attention.weighted_attention_forward`). ``queries``: the cache positions
        of the new tokens (transformers 5.2) or their number (later 5.x)."""
        q = int(queries.shape[0]) if isinstance(queries, torch.Tensor) else int(queries)
        return self.stored_length + q, self.dropped

    def reset(self) -> None:
        """Empty the layer (no tokens, no weights), as transformers' later dynamic layers reset (5.2 zeroed them)."""
        self.keys = self.values = None
        self.is_initialized = False
        self.log_w_num = self.log_w_den = self._split = self._pending = None
        self.dropped = self.compressed_length = 0

    def _each(self, fn) -> None:
        self._split = None
        if self.is_initialized and self.keys.numel():
            self.keys, self.values = fn(self.keys), fn(self.values)
            if self.weighted:
                same = self.log_w_den is self.log_w_num
                self.log_w_num = fn(self.log_w_num)
                self.log_w_den = self.log_w_num if same else fn(self.log_w_den)

    def reorder_cache(self, beam_idx) -> None:
        self._each(lambda x: x.index_select(0, beam_idx.to(x.device)))

    def batch_select_indices(self, indices) -> None:
        self._each(lambda x: x[indices, ...])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._each(lambda x: x.repeat_interleave(repeats, dim=0))

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` LOGICAL tokens; a negative value removes that many tokens from the end
        (transformers 5.2 takes both forms, later 5.x only the negative one). Only tokens appended after the
        compression can be cropped away."""
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
            raise InputError(f"crop takes an integer length, got {max_length!r}")
        n = self.logical_length
        if max_length < 0:
            max_length = n - abs(int(max_length))
        if n <= max_length:
            return
        keep = int(max_length) - self.dropped
        if keep < self.compressed_length:
            if self.dropped:
                raise InputError(f"cannot crop a compressed cache to {max_length} tokens: its first "
                                 f"{self.dropped + self.compressed_length} tokens were compressed away to "
                                 f"{self.compressed_length}")
            self.compressed_length = max(keep, 0)
        self._each(lambda x: x[:, :, :max(keep, 0)])

    def offload(self):
        raise InputError("WeightedLayer does not support offloading")


class WeightedCache(Cache):
    """A ``Cache`` of :class:`WeightedLayer`; ``update`` also checks that the previous layer's weights were read
    by the attention (so a model on the wrong attention raises within its first forward pass)."""

    def __init__(self, layers):
        layers = [l if isinstance(l, WeightedLayer) else WeightedLayer(*l) for l in layers]
        super().__init__(layers=layers)

    @classmethod
    def from_compressed(cls, layers, logical_length: int | None = None) -> "WeightedCache":
        """From per-layer ``(K', V', log_w_num, log_w_den)`` torch tensors of shapes (b, Hkv, m, d) and (b, Hkv, m)
        (weights may be None: exact); layers may differ in m. ``logical_length``: the tokens they stand for."""
        return cls([WeightedLayer(*entry, logical_length=logical_length) for entry in layers])

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        for layer in self.layers:
            if layer._pending is not None and hasattr(layer._pending, HANDOFF):
                raise ModelNotWeighted(not_weighted_message())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
