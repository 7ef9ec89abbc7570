"""Weighted attention inside Hugging Face transformers, on the framework's kernel
(``torch.nn.functional.scaled_dot_product_attention``), registered as ``attn_implementation="kvbounds_weighted"``.

Over a layer of :class:`kvbounds.e2e.WeightedLayer` holding ``(K', V', a, b)``:

    o(q) = sum_i exp(l_i + a_i) v_i / sum_i exp(l_i + b_i),    l_i = <q, k_i> * scale.

* a = b (every selection, BalanceKV's pseudocode): one SDPA call with the additive bias a.
* a != b (SubGen, the released walk): one SDPA call with the bias c = max(a, b) over the values augmented by one
  column, V~ = [V e^{a-c}, e^{b-c}]: its output is (sum e^{l+a} v, sum e^{l+b}) / sum e^{l+c}, and the ratio of
  the two parts is o(q). Every factor e^{a-c}, e^{b-c} is <= 1, so nothing overflows.
* no weights: transformers' own ``sdpa_attention_forward``, mask included.

GQA: the query heads of a KV group are stacked along the query axis ((b, Hkv, rep*L, d)), so the KV heads and
their weights are never repeated. The mask: queries see the stored prefix through the weights (padding is
a = b = -inf) and the L new tokens through the model's mask (causal and padding), which the layer's
``get_mask_sizes`` places at their logical positions. kvpress's head-wise eviction (``module.masked_key_indices``,
AdaKV) is honoured here as a = b = -inf, so it does not depend on whether kvpress was imported first.
"""
from __future__ import annotations

import contextlib
import math
from kvbounds.algorithms.validation import InputError

ATTN_IMPLEMENTATION = "kvbounds_weighted"


def register() -> None:
    """Register :func:`weighted_attention_forward` (and the SDPA mask builder) under ``"kvbounds_weighted"``.
    Idempotent; kvpress's import-time patching is not needed (AdaKV's masked keys are handled here)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(ATTN_IMPLEMENTATION, weighted_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)


def use_weighted_attention(model) -> None:
    """Switch a loaded transformers model to the weighted attention (in place)."""
    register()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)


def require_weighted_attention(model) -> None:
    """Raise :class:`~kvbounds.e2e.ModelNotWeighted` unless ``model`` runs the weighted attention."""
    from ._weighted_cache import ModelNotWeighted, not_weighted_message
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl != ATTN_IMPLEMENTATION:
        raise ModelNotWeighted(f"model runs attn_implementation={impl!r}: " + not_weighted_message())


def _check_call(query, key, value, scaling):
    import torch
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{name} must be a torch tensor (batch, heads, tokens, head_dim), got {type(x).__name__}")
        if not x.is_floating_point():
            raise InputError(f"{name} must be a real floating-point tensor, got {x.dtype}")
    if not query.dtype == key.dtype == value.dtype:
        raise InputError(f"query/key/value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.ndim != 4 or key.ndim != 4 or value.shape[:-1] != key.shape[:-1]:
        raise InputError(f"query/key/value must be (batch, heads, tokens, head_dim), got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    L, M = query.shape[2], key.shape[2]
    if L > M:
        raise InputError(f"more queries ({L}) than keys ({M}): the keys must include the queries' own tokens")
    if query.shape[-1] != key.shape[-1] or query.shape[0] != key.shape[0]:
        raise InputError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must agree in batch and head_dim")
    if not bool(torch.isfinite(query).all()):          # O(L d): the cache's keys/values are checked on the output
        raise InputError("query contains NaN or inf")
    if query.shape[1] % key.shape[1]:
        raise InputError(f"query heads {query.shape[1]} are not a multiple of KV heads {key.shape[1]}")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else scaling
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scaling must be a finite positive number, got {scaling!r}")
    return float(scale)


def weighted_sdpa(query, key, value, log_w_num=None, log_w_den=None, *, scale=None, new_mask=None,
                  dropped: int = 0, full_mask=None, split_values=None):
    """(b, H, L, d) queries over (b, Hkv, M, d) keys/values with (b, Hkv, M) log-weights (None: 0) -> (b, H, L, d).

    The last L keys are the queries' own tokens. Their visibility is ``new_mask`` (bool (b|1, 1, L, L), True =
    visible) or, when None, causal; the first M - L keys are visible to every query, scaled by the weights.
    ``full_mask`` (bool (b|1, 1, L, M)) replaces both when the prefix is not compressed (``dropped == 0``).
    ``split_values``: (c, V~) precomputed for split weights (:meth:`WeightedLayer.split_values`)."""
    import torch
    import torch.nn.functional as F
    scale = _check_call(query, key, value, scale)
    b, H, L, d = query.shape
    Hkv, M = key.shape[1], key.shape[2]
    rep = H // Hkv
    for name, lw in (("log_w_num", log_w_num), ("log_w_den", log_w_den)):
        if lw is not None and not isinstance(lw, torch.Tensor):
            raise InputError(f"{name} must be a torch tensor or None, got {type(lw).__name__}")
    if (log_w_num is None) != (log_w_den is None):
        raise InputError("give both log_w_num and log_w_den, or neither (exact attention)")
    if log_w_num is not None and (tuple(log_w_num.shape) != (key.shape[0], Hkv, M)
                                  or tuple(log_w_den.shape) != (key.shape[0], Hkv, M)):
        raise InputError(f"log-weights must have shape {(key.shape[0], Hkv, M)} (one per key), got "
                         f"{tuple(log_w_num.shape)} and {tuple(log_w_den.shape)}")
    for name, lw in (("log_w_num", log_w_num), ("log_w_den", log_w_den)):
        if lw is not None and not bool((torch.isfinite(lw) | (lw == -math.inf)).all()):
            raise InputError(f"{name} contains NaN or +inf (only -inf, 'not used on this side', is allowed)")
    dt, dev = query.dtype, query.device
    if full_mask is not None and dropped == 0:
        vis = full_mask.expand(b, 1, L, M)
    else:
        new = new_mask if new_mask is not None else torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None, None]
        vis = torch.cat([torch.ones(1, 1, L, M - L, dtype=torch.bool, device=dev).expand(new.shape[0], 1, L, M - L),
                         new.to(torch.bool)], -1)
    mask = torch.zeros(vis.shape, dtype=torch.float32, device=dev).masked_fill_(~vis, -math.inf)  # (b|1, 1, L, M)
    split = split_values is not None or (log_w_num is not None and not (log_w_den is log_w_num
                                                                        or torch.equal(log_w_num, log_w_den)))
    if log_w_num is None:
        bias_kv, v = None, value
    elif not split:
        bias_kv, v = log_w_num, value
    elif split_values is not None:
        bias_kv, v = split_values
    else:
        c = torch.maximum(log_w_num, log_w_den)
        live = torch.isfinite(c)
        fa = torch.where(live, torch.exp(log_w_num - c.where(live, 0)), 0)
        fb = torch.where(live, torch.exp(log_w_den - c.where(live, 0)), 0)
        bias_kv = c
        v = torch.cat([value * fa[..., None].to(value.dtype), fb[..., None].to(value.dtype)], -1)
    # stack each KV group's query heads along the query axis: (b, Hkv, rep*L, d), bias (b, Hkv, rep*L, M)
    qg = query.reshape(b, Hkv, rep * L, d)
    bias = mask[:, :, None] if bias_kv is None else mask[:, :, None] + bias_kv[:, :, None, None, :]
    bias = bias.expand(b, Hkv, rep, L, M).reshape(b, Hkv, rep * L, M).to(dt)
    out = F.scaled_dot_product_attention(qg, key, v.to(dt), attn_mask=bias, scale=scale)
    if split:
        out = out[..., :value.shape[-1]] / out[..., value.shape[-1]:]
    if full_mask is not None or new_mask is not None:     # a query that sees nothing (a padding position): 0
        out = torch.nan_to_num(out, nan=0.0)
    _check_finite_output(out, query, key, value, log_w_den)
    return out.reshape(b, H, L, value.shape[-1])


def _check_finite_output(out, query, key, value, log_w_den) -> None:
    """Never a silent NaN/Inf: a non-finite output (checked on the output, O(L d), not on the whole cache)
    raises InputError naming the input that caused it."""
    import torch
    if bool(torch.isfinite(out).all()):
        return
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not bool(torch.isfinite(x).all()):
            raise InputError(f"{name} contains NaN or inf")
    if log_w_den is not None and bool((log_w_den == -math.inf).all(-1).any()):
        raise InputError("log_w_den is -inf for every key of some (batch, head): the denominator is empty")
    raise InputError(f"the attention overflows {query.dtype} (logits or weighted values beyond its range)")


_PREFILL_OBSERVERS: list = []      # callables (module, query, key, scaling) run on every exact causal prefill


@contextlib.contextmanager
def observe_prefill(fn):
    """Inside the block, ``fn(module, query, key, scaling)`` is called on every exact causal prefill attention
    call (as many queries as keys, no mask, no weights; the rotated queries and keys the kernel reads), e.g.
    to collect H2O's scores while the prefill runs (:func:`kvbounds.e2e._h2o.received_attention`)."""
    if not callable(fn):
        raise InputError(f"fn must be callable (module, query, key, scaling), got {type(fn).__name__}")
    _PREFILL_OBSERVERS.append(fn)
    try:
        yield fn
    finally:
        _PREFILL_OBSERVERS.remove(fn)


def weighted_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention interface: query (b, H, L, d), key/value (b, Hkv, M, d) -> (b, L, H, d), None.
    Reads the weights of the :class:`~kvbounds.e2e.WeightedLayer` that returned ``key``."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from ._weighted_cache import HANDOFF
    _check_call(query, key, value, scaling)
    layer = key.__dict__.pop(HANDOFF, None)
    L, M = query.shape[2], key.shape[2]
    if L == M and hasattr(module, "masked_key_indices"):
        module.masked_key_indices = None          # a new prefill: kvpress's head-wise eviction starts afresh
    masked = getattr(module, "masked_key_indices", None)
    weighted = layer is not None and layer.weighted
    # transformers passes no mask only when L == M or L == 1 (then SDPA's is_causal is right); for a maskless
    # call with 1 < L < M the queries are the last L tokens, which weighted_sdpa's causal mask places correctly
    bottom_right = attention_mask is None and 1 < L < M
    if not weighted and masked is None and (layer is None or layer.dropped == 0) and not bottom_right:
        out, w = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        if attention_mask is None:         # (a masked padding query may be NaN by transformers' own convention)
            _check_finite_output(out, query, key, value, None)
        if _PREFILL_OBSERVERS and attention_mask is None and L == M > 1 and layer is None:
            for fn in list(_PREFILL_OBSERVERS):
                fn(module, query, key, scaling)
        return out, w
    a, b = (layer.log_w_num, layer.log_w_den) if weighted else (None, None)
    if masked is not None:
        a = key.new_zeros(key.shape[:-1], dtype=torch.float32) if a is None else a.clone()
        b = a if b is None or b is layer.log_w_num else b.clone()
        a[masked], b[masked] = -math.inf, -math.inf
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = mask == 0                      # an additive float mask: 0 = visible
    dropped = layer.dropped if layer is not None else 0
    # transformers builds one mask for all layers from layer 0's size; layers kept to other sizes (SubGen's
    # filled caches) read only its last L columns, the queries' own (the stored prefix is visible to every query)
    pre = layer.split_values() if weighted and masked is None and layer.split else None
    out = weighted_sdpa(query, key, value, a, b, scale=scaling, dropped=dropped, split_values=pre,
                        new_mask=None if mask is None else mask[..., -L:],
                        full_mask=None if mask is None or dropped or mask.shape[-1] != M else mask[..., -M:])
    return out.transpose(1, 2).contiguous(), None


def WeightedCache(layers):
    """A :class:`~kvbounds.e2e.WeightedCache` from per-layer ``(K', V', a, b)`` (kept for callers
    of the earlier function)."""
    from ._weighted_cache import WeightedCache as _WC
    return _WC.from_compressed(layers)
