"""A kvpress press run on a bare KV stream (no model): the adapter that turns any press into a compressor with
the method registry's contract (:mod:`kvbounds.methods`), so that ``kvbounds evaluate`` compares it with the
battery's controls on streams.

Inside a model, kvpress calls ``press.compress(module, hidden_states, keys, values, attentions, kwargs)`` after
each attention layer of the prefill (``BasePress.forward_hook``). On a stream there is no model, so the adapter
gives the press a stand-in attention layer (:class:`StreamLayer`) built so that every quantity a press reads is the
stream's own:

  * ``keys``, ``values``: the stream's K, V as (1, heads, n, d) tensors (float64 for a float64 stream, so a press
    that keeps tokens returns them exactly; float32 otherwise): the cache kvpress compresses;
  * ``hidden_states``: the stream's queries, (1, n, heads x d), with ``module.q_proj`` the identity and the rotary
    embedding the identity (cos 1, sin 0), so that the queries a press recomputes from the hidden states
    (``kvpress.utils.get_prerope_query_states`` and RoPE, as SnapKV and TOVA do) are the stream's queries, which
    are already in the keys' frame (a real trace's queries and keys are both post-RoPE);
  * ``attentions``: the causal softmax of Q K^T / sqrt(d), (1, heads, n, n), what an eager model returns with
    ``output_attentions`` (presses that read it, e.g. ObservedAttentionPress, get the stream's attention);
  * ``kwargs``: ``position_embeddings`` (the identity rotation), ``cache_position`` (0..n-1), ``attention_mask``
    None.

The press is built at the compression ratio that keeps exactly the tokens the float budget holds (kvpress's
``compute_n_kept(n, ratio)`` = int(n (1 - ratio))), and its output is checked: tensors of the cache's heads and
widths, finite, holding at most that many tokens (a press that keeps more, fewer than one, or returns NaN is an
:class:`PressError` naming it). The kept tokens carry weight 1 (log-weight 0, no float): kvpress's caches hold
keys and values only, so the floats are kept tokens x (d + dv), counted as the battery counts every cache.

What the adapter cannot run: a press that needs the model itself (its weights, e.g. ExpectedAttentionPress's
query statistics from ``q_proj``'s weights and the rotary frequencies, or a trained gate) raises on the stand-in
layer; :func:`run_press` turns that into a :class:`PressError` saying so, and such a press runs with
``kvbounds evaluate --e2e`` inside the model. A decoding press (kvpress's ``DecodingPress``) compresses while
generating: ``--decode`` runs its base press every interval on a growing stream.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.validation import check_int
from kvbounds.algorithms.compressed_kv import CompressedKV
from kvbounds.algorithms.validation import check_array, check_int, check_rng

__all__ = ["PressError", "StreamLayer", "press_compressor", "run_press", "kept_tokens", "ratio_for", "is_press",
           "is_decoding_press"]


class PressError(InputError):
    """A press that cannot be evaluated on a stream: it raised, returned a cache of the wrong length or shape, or
    non-finite values. The message names the press and what went wrong."""


def _kvpress_class_in(obj) -> bool:
    """Whether a class of kvpress is among the bases of ``obj`` (a class) or of its class: only then can it be a
    press, and only then is kvpress imported to ask (importing kvpress imports torch and transformers: seconds, and
    their warnings, for a numpy compressor that is no press)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(str(getattr(c, "__module__", "")).split(".")[0] == "kvpress" for c in getattr(cls, "__mro__", ()))


def is_press(obj) -> bool:
    """A kvpress press: an instance or subclass of ``kvpress.BasePress`` (False when kvpress is not installed)."""
    if not _kvpress_class_in(obj):
        return False
    try:
        from kvpress import BasePress
    except Exception:   # noqa: BLE001 - kvpress missing or broken: nothing is a press
        return False
    return isinstance(obj, BasePress) or (isinstance(obj, type) and issubclass(obj, BasePress))


def is_decoding_press(obj) -> bool:
    """A kvpress decoding press (compresses while generating: ``DecodingPress`` and its subclasses)."""
    if not _kvpress_class_in(obj):
        return False
    try:
        from kvpress import DecodingPress
    except Exception:   # noqa: BLE001
        return False
    return isinstance(obj, DecodingPress) or (isinstance(obj, type) and issubclass(obj, DecodingPress))


def kept_tokens(floats: int, d: int, dv: int, n: int) -> int:
    """Tokens a press keeps within ``floats`` per head (a key of width d and a value of width dv each): at least
    1, at most n. Integers: floats >= 0; d, dv, n >= 1."""
    floats = check_int(floats, "floats")
    d, dv, n = (check_int(x, name, minimum=1) for x, name in ((d, "d"), (dv, "dv"), (n, "n")))
    return max(1, min(floats // (d + dv), n))


def ratio_for(kept: int, n: int) -> float:
    """The compression ratio (kvpress's meaning: the fraction removed) at which kvpress keeps exactly ``kept`` of
    ``n`` tokens: int(n (1 - ratio)) = kept (the half token keeps float rounding off the boundary)."""
    kept, n = check_int(kept, "kept"), check_int(n, "n", minimum=1, maximum=2**40)
    if not 1 <= kept <= n:
        raise InputError(f"kept must lie in [1, n = {n}], got {kept}")
    return 0.0 if kept == n else 1.0 - (kept + 0.5) / n


class StreamLayer:
    """The stand-in attention layer a press sees on a stream (the module docstring): ``config`` with the head
    counts and sizes, ``head_dim``, ``layer_idx`` 0, ``q_proj`` / ``k_proj`` the identity, ``rotary_emb`` the
    identity rotation. Built lazily as a torch module (:meth:`module`)."""

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int):
        self.n_heads, self.n_kv_heads, self.head_dim = int(n_heads), int(n_kv_heads), int(head_dim)

    def module(self):
        import types

        import torch
        from torch import nn
        layer = nn.Module()
        layer.config = types.SimpleNamespace(
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads, head_dim=self.head_dim,
            hidden_size=self.n_heads * self.head_dim, num_hidden_layers=1, rope_theta=10000.0,
            max_position_embeddings=1 << 20, model_type="stream")
        layer.head_dim = self.head_dim
        layer.layer_idx = 0
        layer.num_key_value_groups = self.n_heads // self.n_kv_heads
        layer.scaling = self.head_dim ** -0.5
        layer.is_causal = True
        layer.q_proj = nn.Identity()
        layer.k_proj = nn.Identity()
        layer.v_proj = nn.Identity()

        class IdentityRotary(nn.Module):
            def forward(self, x, position_ids):
                n = position_ids.shape[-1]
                shape = (position_ids.shape[0], n, x.shape[-1])
                return torch.ones(shape, dtype=x.dtype), torch.zeros(shape, dtype=x.dtype)

        layer.rotary_emb = IdentityRotary()
        return layer


def _inputs(K, V, Q):
    """(keys, values, hidden_states, attentions, kwargs) of one stream layer: K, V (KV heads, n, d) and the queries
    Q (heads, L, d) of the last L <= n positions (L = n at a prefill; the tokens buffered since the last compression
    at decode time, as kvpress's DecodingPress passes them), numpy."""
    import torch
    H, L, d = Q.shape
    n = K.shape[-2]
    dt = np.float64 if K.dtype == np.float64 else np.float32     # a float64 stream stays float64 (exact copies kept)
    keys = torch.from_numpy(np.ascontiguousarray(K, dt))[None]
    values = torch.from_numpy(np.ascontiguousarray(V, dt))[None]
    q = torch.from_numpy(np.ascontiguousarray(Q, dt))[None]              # (1, H, n, d)
    hidden = q.transpose(1, 2).reshape(1, L, H * d)
    rep = H // K.shape[0]
    k_rep = keys.repeat_interleave(rep, dim=1)
    logits = q @ k_rep.transpose(-1, -2) / math.sqrt(d)                  # (1, H, L, n): query i at position n-L+i
    logits = logits.masked_fill(torch.ones(L, n, dtype=torch.bool).triu(n - L + 1), float("-inf"))
    attentions = torch.softmax(logits, dim=-1)
    cos, sin = torch.ones(1, L, d, dtype=q.dtype), torch.zeros(1, L, d, dtype=q.dtype)
    pos = torch.arange(n - L, n)
    kwargs = dict(hidden_states=hidden, position_embeddings=(cos, sin), cache_position=pos,
                  attention_mask=None, past_key_values=None, position_ids=pos[None])
    return keys, values, hidden, attentions, kwargs


def run_press(press, K, V, Q, kept: int, *, name: str = "", seed: int = 0):
    """Run ``press`` (a kvpress press instance, already at the ratio keeping ``kept`` tokens) on one stream layer
    K, V (KV heads, n, d) with the queries Q (heads, L, d) of its last L positions, numpy (float64 stays float64,
    else float32); returns its (keys, values) as numpy (heads, m, d) of that dtype. Raises
    :class:`PressError` when it raises, or returns anything but finite tensors of the cache's heads and widths
    with 1 <= m <= kept tokens."""
    import torch
    label = name or type(press).__name__
    if Q is None:
        raise PressError(f"{label}: the stream has no queries")
    H, n, d = Q.shape[0], K.shape[-2], K.shape[-1]
    module = StreamLayer(H, K.shape[0], d).module()
    keys, values, hidden, attentions, kwargs = _inputs(K, V, Q)
    torch.manual_seed(int(seed) % (2**63))
    try:
        with torch.no_grad():
            if hasattr(press, "post_init_from_model"):
                press.post_init_from_model(_NoModel(module))
            out = press.compress(module, hidden, keys, values, attentions, kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of the press is the press's, named
        msg = " ".join(str(e).split())[:300]
        raise PressError(f"{label} raised {type(e).__name__}: {msg} on a bare stream (n = {n}, d = {d}); a press "
                         "that needs the model itself runs with `kvbounds evaluate --e2e`") from e
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)):
        raise PressError(f"{label}.compress returned {type(out).__name__}, not (keys, values) tensors")
    k, v = out
    want_k, want_v = (1, K.shape[0], None, d), (1, V.shape[0], None, V.shape[-1])
    for x, want, what in ((k, want_k, "keys"), (v, want_v, "values")):
        if x.ndim != 4 or any(w is not None and s != w for s, w in zip(x.shape, want)):
            raise PressError(f"{label} returned {what} of shape {tuple(x.shape)}; the cache is "
                             f"{tuple(w if w is not None else 'tokens' for w in want)}")
    if k.shape[2] != v.shape[2]:
        raise PressError(f"{label} returned {k.shape[2]} keys but {v.shape[2]} values")
    m = int(k.shape[2])
    if not 1 <= m <= kept:
        raise PressError(f"{label} returned a cache of {m} tokens; at compression ratio {ratio_for(kept, n):.4f} "
                         f"it must hold between 1 and {kept} of the {n} tokens (wrong length)")
    k, v = k[0].numpy(), v[0].numpy()
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(v))):
        raise PressError(f"{label} returned non-finite keys or values (NaN or Inf)")
    return k, v


class _NoModel:
    """What ``post_init_from_model`` receives on a stream: a model with one stand-in layer and the stream's config
    (a press that reads anything else from the model raises, and is named as needing the model)."""

    def __init__(self, layer):
        self.config = layer.config
        self.device = "cpu"
        self.dtype = None


def press_compressor(make, *, name: str = ""):
    """A compressor with the method registry's contract running the press ``make(ratio)`` builds (``make``: a
    function of the compression ratio returning a press instance): it keeps the tokens ``floats`` hold
    (:func:`kept_tokens`), weight 1. Needs the stream's queries ``Q`` (K's shape, or (query heads, n, d))."""
    def compress(K, V, floats, rng, *, sink=0, window=0, block_size=64, Q=None):
        if Q is None:
            raise InputError(f"{name or 'the press'} needs the stream's queries Q")
        check_rng(rng)
        floats = check_int(floats, "floats")
        for x, what in ((K, "K"), (V, "V"), (Q, "Q")):
            if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
                raise InputError(f"{what} must be a float numpy array (heads, n, d), got "
                                 f"{getattr(x, 'dtype', type(x).__name__)}")
            check_array(x, what, ndim=(2, 3), min_rows=1)
        if K.shape != Q.shape or K.shape[:-1] != V.shape[:-1]:
            raise InputError(f"K {K.shape}, V {V.shape} and Q {Q.shape} must hold the same heads and tokens "
                             "(Q of K's shape)")
        squeeze = K.ndim == 2
        if squeeze:
            K, V, Q = K[None], V[None], Q[None]
        n = K.shape[-2]
        kept = kept_tokens(floats, K.shape[-1], V.shape[-1], n)
        press = make(ratio_for(kept, n))
        seed = int(rng.integers(2**62))
        if hasattr(press, "seed"):
            press.seed = seed
        k, v = run_press(press, K, V, Q, kept, name=name, seed=seed)
        z = np.zeros(k.shape[:-1], k.dtype)
        c = CompressedKV(k[0] if squeeze else k, v[0] if squeeze else v, z[0] if squeeze else z,
                         (z[0] if squeeze else z).copy())
        return c
    compress.__name__ = f"press_compressor({name or 'press'})"
    return compress
