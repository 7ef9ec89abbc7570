"""Weighted attention inside Hugging Face transformers: a cache that stores per-token log-weights beside K/V,
and an attention function (registered through ``transformers.AttentionInterface``) that reads them.

The contract (issue 14; :class:`kvbounds.algorithms.token_selection.CompressedKV`): a layer's compressed cache
is ``(K', V', log_w_num, log_w_den)`` per KV head, and attention over it is

    o(q) = sum_i exp(l_i + a_i) v_i / sum_i exp(l_i + b_i),    l_i = <q, k_i> * scale,

a = log_w_num, b = log_w_den (-inf drops a token from one side). Tokens appended after compression (the
continuation, the question) get a = b = 0, so exact attention is the special case a = b = 0. Computed as
``softmax(l + a) V * exp(LSE(l + a) - LSE(l + b))``. GQA: the weights live per KV head and are repeated to
the query heads of its group, as K and V are.

The causal structure is rebuilt from the shapes, ignoring the model's mask: the last L keys are the L queries'
own tokens (causal among them), every earlier key (the compressed prefix) is visible to all of them. This holds
for a prefill (no prefix) and for any continuation fed after a (compressed) cache, batch size 1, no padding.
Positions are the caller's: pass ``position_ids`` = the original positions (RoPE), not the cache length.
"""
from __future__ import annotations

import math

ATTN_IMPLEMENTATION = "kvbounds_weighted"
_LOGW = "_kvbounds_log_weights"        # attribute carried by the key tensor the cache returns
_registered = False


def register() -> None:
    """Register :func:`weighted_attention_forward` under ``attn_implementation="kvbounds_weighted"``."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    AttentionInterface.register(ATTN_IMPLEMENTATION, weighted_attention_forward)
    _registered = True


def weighted_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query (b, H, L, d), key/value (b, Hkv, M, d) -> (b, L, H, d), None. Reads the log-weights the
    :class:`WeightedCache` attached to ``key``; without them, exact causal attention."""
    import torch
    import torch.nn.functional as F
    b, H, L, d = query.shape
    Hkv, M = key.shape[1], key.shape[2]
    rep = H // Hkv
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    lw = getattr(key, _LOGW, None)
    k = key.repeat_interleave(rep, dim=1) if rep > 1 else key
    v = value.repeat_interleave(rep, dim=1) if rep > 1 else value
    if lw is None:
        if M == L:
            out = F.scaled_dot_product_attention(query, k, v, is_causal=True, scale=scale)
        else:
            out = F.scaled_dot_product_attention(query, k, v, attn_mask=_visible(L, M, query.device), scale=scale)
        return out.transpose(1, 2).contiguous(), None
    a, bb = lw
    a = a.repeat_interleave(rep, dim=1) if rep > 1 else a
    bb = bb.repeat_interleave(rep, dim=1) if rep > 1 else bb
    logits = torch.matmul(query.float(), k.float().transpose(2, 3)) * scale        # (b, H, L, M)
    hidden = ~_visible(L, M, query.device)
    ln = (logits + a[:, :, None, :].float()).masked_fill(hidden, -math.inf)
    ld = (logits + bb[:, :, None, :].float()).masked_fill(hidden, -math.inf)
    lse_n, lse_d = torch.logsumexp(ln, -1, keepdim=True), torch.logsumexp(ld, -1, keepdim=True)
    p = torch.exp(ln - lse_n) * torch.exp(lse_n - lse_d)
    out = torch.matmul(p, v.float()).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def _visible(L: int, M: int, device):
    """(L, M) bool: key j is visible to query i iff j <= M - L + i."""
    import torch
    i = torch.arange(L, device=device)[:, None]
    j = torch.arange(M, device=device)[None, :]
    return j <= (M - L) + i


def _weighted_layer_class():
    from transformers.cache_utils import DynamicLayer

    class WeightedLayer(DynamicLayer):
        """A DynamicLayer with log_w_num / log_w_den (b, Hkv, m) beside keys / values (b, Hkv, m, d)."""

        def __init__(self, keys, values, log_w_num=None, log_w_den=None):
            super().__init__()
            import torch
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values
            shape = tuple(keys.shape[:-1])
            z = lambda: torch.zeros(shape, dtype=torch.float32, device=keys.device)
            self.log_w_num = z() if log_w_num is None else log_w_num.to(keys.device, torch.float32)
            self.log_w_den = z() if log_w_den is None else log_w_den.to(keys.device, torch.float32)
            self.weighted = log_w_num is not None or log_w_den is not None

        def update(self, key_states, value_states, cache_kwargs=None):
            import torch
            keys, values = super().update(key_states, value_states, cache_kwargs)
            if self.weighted:
                z = torch.zeros(tuple(key_states.shape[:-1]), dtype=torch.float32, device=keys.device)
                self.log_w_num = torch.cat([self.log_w_num, z], -1)
                self.log_w_den = torch.cat([self.log_w_den, z], -1)
                setattr(keys, _LOGW, (self.log_w_num, self.log_w_den))
            return keys, values

    return WeightedLayer


class _Factory:
    layer = None


def WeightedCache(layers):
    """A transformers ``Cache`` from per-layer ``(K', V', log_w_num, log_w_den)`` torch tensors of shapes
    (b, Hkv, m, d) and (b, Hkv, m) (weights may be None: exact). Layers may differ in m."""
    from transformers.cache_utils import Cache
    if _Factory.layer is None:
        _Factory.layer = _weighted_layer_class()
    return Cache(layers=[_Factory.layer(*entry) for entry in layers])
