"""Queries, keys and values captured from a Hugging Face ``transformers`` model's own forward pass.

The real-trace models (:mod:`.smollm2`, :mod:`.minilm`) are loaded with transformers' loaders and run
with ``attn_implementation="kvbounds_trace"``: the attention function below, registered in transformers'
``AttentionInterface``, receives every layer's queries and keys as the model computed them (after RoPE
for Llama), optionally lets a hook replace them, runs ``torch.nn.functional.scaled_dot_product_attention``
and records q, k, v and the attention output of the layers asked for. Pre-RoPE queries and keys come from
forward hooks on the q/k projections (:func:`projection_hooks`). Nothing here is a forward pass of ours.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import os

__all__ = ["ATTN_IMPLEMENTATION", "ModelUnavailable", "require", "quiet_transformers", "register", "capturing",
           "projection_hooks"]

ATTN_IMPLEMENTATION = "kvbounds_trace"


class ModelUnavailable(RuntimeError):
    """A model package (or a library needed to read it) is not installed."""


def require(module: str, pip_name: str, model: str = "SmolLM2"):
    """Import a package a model needs, or raise ModelUnavailable saying which and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModelUnavailable(f"{model} needs the Python package {pip_name!r} ({e}); pip install 'kvbounds[models]' "
                               f"(or 'kvbounds[hf]', which includes it)") from None


def quiet_transformers() -> None:
    """No progress bars or info logs from transformers' loaders (they run inside the checks' workers)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()


# the running capture: {"layers": {module id: layer}, "want": set, "hook": callable | None, "caps": dict}
_STATE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("kvbounds_trace_state", default=None)


def _trace_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """(batch 1) query (1, H, n, d), key/value (1, Hkv, n, d) -> output (1, n, H, d), as transformers' SDPA
    path but with grouped heads repeated head by head (query head h reads KV head h // (H / Hkv))."""
    import torch.nn.functional as F
    st = _STATE.get()
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError("trace capture runs one unpadded sequence at a time (no attention mask, batch 1)")
    causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
    l = st["layers"][id(module)] if st else -1
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)   # (n, heads, d)
    if st and st["hook"] is not None:
        q, k, v = st["hook"](l, q, k, v)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k_all, v_all = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    else:
        k_all, v_all = k, v
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k_all.transpose(0, 1)[None],
                                       v_all.transpose(0, 1)[None], is_causal=causal and q.shape[0] > 1,
                                       scale=scaling)[0].transpose(0, 1)
    if st and l in st["want"]:
        st["caps"].setdefault(l, {}).update(q=q.numpy().copy(), k=k.numpy().copy(), v=v.numpy().copy(),
                                            attn=o.numpy().copy())
    return o[None].contiguous(), None


def register() -> None:
    """Register the capturing attention (and transformers' SDPA mask builder) under ``"kvbounds_trace"``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(ATTN_IMPLEMENTATION, _trace_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)


@contextlib.contextmanager
def capturing(attention_modules, want=(), hook=None):
    """Within the block, the model's attention records the layers in ``want`` into the yielded dict
    layer -> {"q", "k", "v", "attn": (n, heads, d) float32 numpy}; ``hook(layer, q, k, v) -> (q, k, v)``
    may replace what attention reads."""
    st = {"layers": {id(m): l for l, m in enumerate(attention_modules)}, "want": {int(l) for l in want},
          "hook": hook, "caps": {}}
    token = _STATE.set(st)
    try:
        yield st["caps"]
    finally:
        _STATE.reset(token)


@contextlib.contextmanager
def projection_hooks(projections: dict, caps: dict, heads: dict):
    """Forward hooks on Linear layers: ``projections[(layer, name)]`` is recorded as ``caps[layer][name]``
    reshaped to (n, heads[name], d) (the pre-RoPE queries and keys of a Llama layer)."""
    handles = []

    def make(l, name):
        def hook(_mod, _inp, out):
            caps.setdefault(l, {})[name] = out[0].reshape(out.shape[1], heads[name], -1).numpy().copy()
        return hook

    try:
        for (l, name), mod in projections.items():
            handles.append(mod.register_forward_hook(make(l, name)))
        yield caps
    finally:
        for h in handles:
            h.remove()
