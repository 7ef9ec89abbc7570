"""Streaming presses: a KV cache kept at a fixed size while a model reads its prompt and generates (issue 23; claims
BKV.decode, SG.decode).

``with StreamingBalanceKVPress(target=256, interval=64)(model): ...`` (or :func:`generate`, which also feeds the
prompt in chunks of ``interval``): after each attention call the press turns the layer into a
:class:`~kvbounds.e2e.weighted_cache.WeightedLayer` (keys, values, log-weights, logical length); once the layers hold
``target + interval`` tokens, every layer is reduced back to ``target`` at once, after the last layer's attention of
that forward pass, all layers, rows and KV heads stacked in one batch. A layer's stored tokens are

    [ sink (exact) | compressed middle (target - sink - window weighted tokens) | recent tokens (exact) ],

and a reduction moves the recent tokens older than the last ``window`` into the middle with their existing weights
and compresses the middle back to its size: :class:`StreamingBalanceKVPress` by merge-and-reduce over weighted
coresets (:mod:`kvbounds.streaming.balance`), :class:`StreamingSubGenPress` by SubGen's clusters and l2 samples
(:mod:`kvbounds.streaming.subgen`). So no attention call ever sees more than ``target + interval`` tokens per layer
when the input comes in chunks of at most ``interval`` (:func:`generate`); a whole prompt given at once (inside
``model.generate``) is held exactly during its own forward pass and reduced right after it.

The same safety rules as :mod:`kvbounds.press`: the model must run the weighted attention (else
:class:`~kvbounds.e2e.weighted_cache.ModelNotWeighted` on entering the press), padding (from the attention mask of
the first chunk) is stored with weight 0 (log-weight -inf: with left padding a row's sink counts its pad positions),
and ``reorder_cache``/``crop``/``batch_select_indices`` keep the weights aligned (the layer's own methods). The
press's own per-row state (SubGen's centres and counts, the certificate's sums) does not follow a reordering of the
rows (beam search): use greedy or sampled decoding, one beam per row; a change of the batch size between reductions
raises :class:`~kvbounds.algorithms.validation.InputError`. Non-finite hidden states raise ``InputError`` at the
first layer.

The live certificate (:meth:`StreamingPress.certificate`): per layer and query head, an error bar on the compressed
attention output computed from the press's own state, without exact attention; each press's docstring says what it
is (a bound for BalanceKV, a sampling estimate for SubGen).
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Callable, ClassVar

import numpy as np
import torch
from kvpress import BasePress

from kvbounds.algorithms.validation import InputError
from kvbounds.e2e.attention import register, require_weighted_attention
from kvbounds.e2e.weighted_cache import WeightedLayer
from kvbounds.press import visible_tokens

from . import balance
from .subgen import SubGenState

register()
MIN_MIDDLE = 16


@dataclasses.dataclass
class StreamingPress(BasePress):
    """Base of the streaming presses (module docstring). ``target``: tokens kept per layer after a reduction;
    ``interval``: new tokens between reductions; ``sink``/``window``: first/last tokens kept exactly."""
    target: int = 256
    interval: int = 64
    sink: int = 4
    window: int = 32
    seed: int = 0
    observer: Callable | None = None      # observer(press, module, kwargs, layer) after each attention call
    name: ClassVar[str] = ""

    def __post_init__(self):
        for nm in ("target", "interval", "sink", "window", "seed"):
            v = getattr(self, nm)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"{nm} must be a non-negative integer, got {v!r}")
        if self.interval < 1:
            raise InputError(f"interval must be >= 1 (new tokens between reductions), got {self.interval}")
        if self.target < self.sink + self.window + MIN_MIDDLE:
            raise InputError(f"target must be >= sink + window + {MIN_MIDDLE} (a compressed middle of at least "
                             f"{MIN_MIDDLE} tokens), got target = {self.target}, sink = {self.sink}, "
                             f"window = {self.window}")
        self._n_layers = None
        self.reset()

    @property
    def middle(self) -> int:
        return self.target - self.sink - self.window

    def reset(self) -> None:
        self._gen = torch.Generator().manual_seed(int(self.seed))
        self.peak = 0                  # the most tokens a layer held during an attention call
        self.reductions = 0
        self._mid = 0                  # tokens in the compressed middle (every layer the same)
        self._vmax = None              # (layers, b, Hkv) the largest value norm absorbed into the middle

    @contextmanager
    def __call__(self, model):
        require_weighted_attention(model)
        self._n_layers = int(model.config.num_hidden_layers)
        with BasePress.__call__(self, model):
            yield

    def forward_hook(self, module, input, kwargs, output):
        cache = kwargs.get("past_key_values")
        if cache is None:
            return output
        idx = module.layer_idx
        self._attn_scale = float(getattr(module, "scaling", 1.0 / math.sqrt(kwargs["hidden_states"].shape[-1])))
        if idx == 0 and not bool(torch.isfinite(kwargs["hidden_states"]).all()):
            raise InputError("hidden_states contain NaN or inf: the streaming press cannot compress them")
        layer = cache.layers[idx]
        if not isinstance(layer, WeightedLayer):       # a new cache: the press's state starts afresh
            if idx == 0:
                self.reset()
            layer = cache.layers[idx] = self._weighted(layer, kwargs)
        stored = int(layer.keys.shape[-2])
        self.peak = max(self.peak, stored)
        if self.observer is not None:
            self.observer(self, module, kwargs, layer)
        if idx == self._n_layers - 1 and stored >= self.target + self.interval:
            self._reduce(cache)
        return output

    def _weighted(self, layer, kwargs) -> WeightedLayer:
        if getattr(layer, "keys", None) is None or layer.keys.shape[-2] != kwargs["hidden_states"].shape[1]:
            raise InputError("a streaming press must be entered before the first forward pass (it found a cache "
                             "filled without it)")
        k, v = layer.keys, layer.values
        b, n = k.shape[0], k.shape[2]
        vis = visible_tokens(kwargs.get("attention_mask"), b, n, k.device)
        a = torch.zeros(k.shape[:-1], dtype=torch.float32).masked_fill(~vis[:, None, :], -math.inf)
        return WeightedLayer(k, v, a, a, logical_length=n)

    # ------------------------------------------------------------------ one reduction of every layer
    def _reduce(self, cache) -> None:
        layers = cache.layers[:self._n_layers]
        b, H, S, d = layers[0].keys.shape
        flat = lambda x: torch.cat(list(x)).reshape(len(layers) * b * H, S, *x[0].shape[3:])
        K, V = flat([l.keys for l in layers]), flat([l.values for l in layers])
        A, Bw = flat([log_weights(l)[0] for l in layers]), flat([log_weights(l)[1] for l in layers])
        s, mid, w = self.sink, self._mid, self.window
        cut = (slice(None, s), slice(s, s + mid), slice(s + mid, S - w), slice(S - w, None))
        if self._vmax is not None and self._vmax.shape != (len(layers), b, H):
            raise InputError(f"the batch changed from {self._vmax.shape[1]} to {b} rows between reductions: a "
                             "streaming press's state is per row (no beam search or batch selection)")
        Km, Vm, Am, Bm = self._reduce_middle(*(x[:, cut[1]] for x in (K, V, A, Bw)),
                                             *(x[:, cut[2]] for x in (K, V, A, Bw)), scale=self._attn_scale)
        vmax = V[:, cut[2]].double().norm(dim=-1).max(-1).values.reshape(len(layers), b, H)
        self._vmax = vmax if self._vmax is None else torch.maximum(self._vmax, vmax)
        self._mid = Km.shape[1]
        Kn = torch.cat([K[:, cut[0]], Km.to(K.dtype), K[:, cut[3]]], 1)
        Vn = torch.cat([V[:, cut[0]], Vm.to(V.dtype), V[:, cut[3]]], 1)
        An = torch.cat([A[:, cut[0]], Am.float(), A[:, cut[3]]], 1)
        Bn = An if Bm is None else torch.cat([Bw[:, cut[0]], Bm.float(), Bw[:, cut[3]]], 1)
        S2 = Kn.shape[1]
        for i, layer in enumerate(layers):
            sl = slice(i * b * H, (i + 1) * b * H)
            layer.keys = Kn[sl].reshape(b, H, S2, d).contiguous()
            layer.values = Vn[sl].reshape(b, H, S2, Vn.shape[-1]).contiguous()
            layer.log_w_num = An[sl].reshape(b, H, S2).contiguous()
            layer.log_w_den = layer.log_w_num if Bm is None else Bn[sl].reshape(b, H, S2).contiguous()
            layer.dropped += S - S2
            layer.stored = S2
            layer._split = None
        self.reductions += 1

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale):
        raise NotImplementedError

    # ------------------------------------------------------------------ reading the cache at a query
    def certificate(self, layer_idx: int, layer: WeightedLayer, q: torch.Tensor, scale: float) -> torch.Tensor:
        """An error bar on the compressed attention output at queries ``q`` (b, H, d) (post-RoPE, this layer, logit
        scale ``scale``): (b, H) float64; 0 before the first reduction (the cache is then exact)."""
        raise NotImplementedError


def log_weights(layer: WeightedLayer):
    """(log_w_num, log_w_den) of a layer, zeros where it holds none (an exact layer)."""
    if layer.log_w_num is not None:
        return layer.log_w_num, layer.log_w_den
    z = torch.zeros(layer.keys.shape[:-1], dtype=torch.float32)
    return z, z


def weighted_output(layer: WeightedLayer, q: torch.Tensor, scale: float):
    """The cache's attention output at queries q (b, H, d): (sum e^{l+a} v / sum e^{l+b}) (b, H, e) float64, and
    log sum e^{l+b} (b, H), with l = <q, k> scale (the weighted attention's formula, for one query per head)."""
    b, H, d = q.shape
    Hkv = layer.keys.shape[1]
    qg = q.double().reshape(b, Hkv, H // Hkv, d)
    lg = torch.einsum("bgrd,bgmd->bgrm", qg, layer.keys.double()) * scale
    a, bb = (x.double()[:, :, None] for x in log_weights(layer))
    ln = torch.logsumexp(lg + bb, -1)
    wn = torch.exp(lg + a - ln[..., None])
    out = torch.einsum("bgrm,bgme->bgre", wn, layer.values.double())
    return out.reshape(b, H, -1), ln.reshape(b, H), lg


@dataclasses.dataclass
class StreamingBalanceKVPress(StreamingPress):
    """BalanceKV as a stream (BalanceKV-NeurIPS Thm 3.1, Alg. 1 with Alg. 4's merge-and-reduce and Alg. 2's
    self-balancing walk; :mod:`kvbounds.streaming.balance` says which step each part is and where it differs).

    Certificate: a bound (deterministic, given the stored state): the sum over every halving of the Cauchy-Schwarz
    bound on its error, ||o_hat - o|| <= e^{||q||^2 scale / 2} (X_num + R_v X_den) / Z_hat with R_v the largest value
    norm absorbed and Z_hat the cache's denominator (the error of the stored sums relative to exact ones, exact in
    exact arithmetic; vacuous when e^{(||q||^2 + max||k||^2) scale / 2} dwarfs Z_hat, which real keys do)."""
    name: ClassVar[str] = "BalanceKV (streaming)"

    def reset(self) -> None:
        super().reset()
        self._levels: list[int] = []
        self._cert = None

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale):
        if self._cert is None:
            self._cert = balance.Certificate((Km.shape[0],))
        K, V = torch.cat([Km, Kx], 1), torch.cat([Vm, Vx], 1)
        logw = torch.cat([Am, Ax], 1)
        levels = self._levels + [0] * Kx.shape[1]
        K, V, logw, self._levels = balance.reduce_middle(K, V, logw, levels, self.middle, sink=0, scale=scale,
                                                         gen=self._gen, cert=self._cert)
        return K, V, logw, None

    def certificate(self, layer_idx, layer, q, scale):
        b, H, d = q.shape
        Hkv = layer.keys.shape[1]
        if self._cert is None:
            return torch.zeros(b, H, dtype=torch.float64)
        _, logz, _ = weighted_output(layer, q, scale)
        sl = slice(layer_idx * b * Hkv, (layer_idx + 1) * b * Hkv)
        xn, xd = self._cert.x_num[sl].reshape(b, Hkv), self._cert.x_den[sl].reshape(b, Hkv)
        vmax = torch.maximum(self._vmax[layer_idx], layer.values.double().norm(dim=-1).max(-1).values)
        x = (xn + vmax * xd).repeat_interleave(H // Hkv, 1)                       # (b, H)
        qn2 = (q.double() ** 2).sum(-1) * scale
        return torch.exp(qn2 / 2 + torch.log(x) - logz)


@dataclasses.dataclass
class StreamingSubGenPress(StreamingPress):
    """SubGen as a stream (SubGen Alg. 1, Thm 1; ClusterGen Thm 2.4; :mod:`kvbounds.streaming.subgen`): the middle
    holds ``clusters`` centres' uniform samples (``per_cluster`` each) for the denominator and l2 samples of the
    values for the numerator (the rest of the middle), split weights (log_w_num != log_w_den).

    Certificate: an estimate, not a bound: 3 (se_num + R_v se_den) / Z_hat, the sampling standard errors of the two
    sums from the slots themselves (sample variances), R_v the largest value norm absorbed, Z_hat the cache's
    denominator (3 standard errors: a normal-approximation 99.7% bar that the samples' own spread can understate)."""
    clusters: int = 8
    per_cluster: int = 0                 # 0: half the middle over the clusters
    name: ClassVar[str] = "SubGen (streaming)"

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.clusters, bool) or not isinstance(self.clusters, (int, np.integer)) or self.clusters < 1:
            raise InputError(f"clusters must be a positive integer, got {self.clusters!r}")
        t = self.per_cluster or max(1, (self.middle // 2) // self.clusters)
        if self.clusters * t >= self.middle:
            raise InputError(f"clusters * per_cluster = {self.clusters * t} must be less than the middle "
                             f"(target - sink - window = {self.middle}): the rest holds the value samples")
        self._t = t

    def reset(self) -> None:
        super().reset()
        self._state = None

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale):
        B, d, e = Kx.shape[0], Kx.shape[-1], Vx.shape[-1]
        if self._state is None:
            t = self._t
            self._state = SubGenState(B, d, e, clusters=self.clusters, per_cluster=t,
                                      samples=self.middle - self.clusters * t)
            n = self._state.slots
            Km, Vm = Kx.new_zeros(B, n, d), Vx.new_zeros(B, n, e)
        alive = torch.isfinite(Ax) | torch.isfinite(Bx)
        return self._state.absorb(Km, Vm, Kx, Vx, alive, self._gen)

    def certificate(self, layer_idx, layer, q, scale):
        b, H, d = q.shape
        Hkv = layer.keys.shape[1]
        if self._state is None:
            return torch.zeros(b, H, dtype=torch.float64)
        _, logz, lg = weighted_output(layer, q, scale)                            # lg (b, Hkv, rep, S)
        s, n = self.sink, self._state.slots
        sl = slice(layer_idx * b * Hkv, (layer_idx + 1) * b * Hkv)
        view = _StateView(self._state, sl)
        Km = layer.keys[:, :, s:s + n].reshape(b * Hkv, n, d)
        Vm = layer.values[:, :, s:s + n].reshape(b * Hkv, n, -1)
        se_n, se_d, mx = view.standard_errors(Km, Vm, lg[..., s:s + n].reshape(b * Hkv, H // Hkv, n))
        vmax = torch.maximum(self._vmax[layer_idx], layer.values.double().norm(dim=-1).max(-1).values)
        x = se_n + vmax.reshape(b * Hkv, 1) * se_d
        return (3 * x * torch.exp(mx.double() - logz.reshape(b * Hkv, -1))).reshape(b, H)


class _StateView(SubGenState):
    """One layer's rows of a stacked :class:`SubGenState` (for :meth:`SubGenState.standard_errors`)."""

    def __init__(self, state: SubGenState, sl: slice):      # noqa: super().__init__ not called: a view
        self.m, self.t, self.s = state.m, state.t, state.s
        self.counts, self.W = state.counts[sl], state.W[sl]


def generate(model, press: StreamingPress, input_ids, max_new_tokens: int, *, chunk: int | None = None):
    """Greedy generation with ``press``: the prompt fed in chunks of ``chunk`` (default: the press's interval), so
    no layer ever holds more than target + interval tokens, then one token per step. Returns the (b, n + new)
    token ids."""
    from transformers import DynamicCache
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise InputError(f"input_ids must be a (batch, tokens) torch.long tensor, got {getattr(input_ids, 'shape', input_ids)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    chunk = chunk or press.interval
    cache, ids = DynamicCache(), input_ids
    with torch.no_grad(), press(model):
        for i in range(0, ids.shape[1], chunk):
            logits = model(input_ids=ids[:, i:i + chunk], past_key_values=cache, use_cache=True).logits
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            logits = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits
    return ids
