"""Streaming presses: a KV cache kept at a fixed size while a model reads its prompt and generates (claims
BKV.decode, SG.decode).

``with StreamingBalanceKVPress(target=256, interval=64)(model): ...`` (or :func:`kvbounds.presses.generate`,
which also feeds the prompt in chunks of ``interval``): after each attention call of the first forward pass the
press turns the layer into a :class:`~kvbounds.presses._streaming.layer.StreamingLayer` (a
:class:`~kvbounds.e2e.WeightedLayer`: keys, values, log-weights, logical length). Every layer is
reduced back to ``target`` tokens at once, all layers, rows and KV heads stacked in one batch, whenever the next
tokens would push the layers past ``target + interval`` (checked by the first layer before it appends them) and
after a forward pass that leaves them at ``target + interval`` or more. A layer's stored tokens are

    [ sink (exact) | compressed middle (target - sink - window weighted tokens) | recent tokens (exact) ],

and a reduction moves the recent tokens older than the last ``window`` into the middle with their existing weights
and compresses the middle back to its size: :class:`StreamingBalanceKVPress` by merge-and-reduce over weighted
coresets (:mod:`kvbounds.presses._streaming.balance`), :class:`StreamingSubGenPress` by SubGen's clusters and l2 samples
(:mod:`kvbounds.presses._streaming.subgen`). So no attention call ever sees more than ``target + interval`` tokens per
layer
when the input comes in chunks of at most ``interval`` tokens, whatever ``target`` and ``interval`` are; a longer
chunk (a whole prompt given at once, inside ``model.generate`` or kvpress's pipeline) is held exactly during its own
forward pass and reduced right after it.

The reductions are the cache's own: they go on after the press's context is left (kvpress's
``"kv-press-text-generation"`` pipeline compresses the context inside it and answers outside it). Leaving the
context records the state (references to every layer's tensors and the press's own state, one more copy of the
cache once it moves on); cropping a layer back to that logical length restores it, which is how the pipeline asks
each of several questions from the same compressed context.

The press follows kvpress's press protocol (``press(model)`` is a context manager that hooks the attention layers)
without needing kvpress, so it runs on every transformers version the package admits. Safety rules as in
:mod:`kvbounds.presses`: the model must run the weighted attention (else
:class:`~kvbounds.e2e.ModelNotWeighted` on entering), padding (from the attention mask of the first
pass) is stored with weight 0 (log-weight -inf; with left padding a row's sink counts its pad positions, and each
row's weights always sum to its visible tokens), non-finite hidden states, keys or values raise
:class:`~kvbounds.algorithms.validation.InputError`. Each row draws from its own random stream seeded by ``seed``
(a row's draws do not depend on the other rows). Beam search, batch selection and repetition are refused
(InputError): the press's per-row state would not follow the rows.

The live error bar (:meth:`StreamingPress.certificate`, :meth:`StreamingPress.error_bar`,
:mod:`kvbounds.presses._streaming.certificate`): per layer and query head, computed from the press's own state,
without exact
attention, as an :class:`~kvbounds.presses.ErrorBar` saying what it is (a bound or an estimate) and
where it is vacuous.
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Callable, ClassVar

import numpy as np
import torch

from kvbounds.algorithms.validation import InputError
from kvbounds.e2e import check_pipeline_call
from kvbounds.e2e import register, require_weighted_attention
from kvbounds.e2e import WeightedLayer, visible_tokens

from . import inputs
from .certificate import ErrorBar
from .layer import StreamingLayer

register()
MIN_MIDDLE = 16
SEED_LIMIT = 2 ** 63             # torch.Generator.manual_seed takes a signed 64-bit seed


def cache_of(kwargs):
    """The cache an attention call was given: ``past_key_values`` (transformers 5.2) or ``cache`` (later 5.x)."""
    cache = kwargs.get("past_key_values")
    return kwargs.get("cache") if cache is None else cache


@dataclasses.dataclass
class StreamingPress:
    """Base of the streaming presses (module docstring). ``target``: tokens kept per layer after a reduction;
    ``interval``: new tokens between reductions; ``sink``/``window``: first/last tokens kept exactly; ``seed``: the
    seed of every row's random stream (0 <= seed < 2^63); ``observer(press, module, kwargs, layer)``: called after
    each attention call inside the context."""
    target: int = 256
    interval: int = 64
    sink: int = 4
    window: int = 32
    seed: int = 0
    observer: Callable | None = None
    name: ClassVar[str] = ""

    def __post_init__(self):
        for nm in ("target", "interval", "sink", "window", "seed"):
            v = getattr(self, nm)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"{nm} must be a non-negative integer, got {v!r}")
            setattr(self, nm, int(v))
        if self.seed >= SEED_LIMIT:
            raise InputError(f"seed must be less than 2^63 (a torch generator's seed), got {self.seed}")
        if self.interval < 1:
            raise InputError(f"interval must be >= 1 (new tokens between reductions), got {self.interval}")
        if self.target < self.sink + self.window + MIN_MIDDLE:
            raise InputError(f"target must be >= sink + window + {MIN_MIDDLE} (a compressed middle of at least "
                             f"{MIN_MIDDLE} tokens), got target = {self.target}, sink = {self.sink}, "
                             f"window = {self.window}")
        if self.observer is not None and not callable(self.observer):
            raise InputError(f"observer must be callable (press, module, kwargs, layer) or None, got "
                             f"{type(self.observer).__name__}")
        self._n_layers = None
        self.session = 0
        self.reset()

    @property
    def n_layers(self) -> int | None:
        """The attention layers of the model the press was last entered on (None before)."""
        return self._n_layers

    @property
    def middle(self) -> int:
        """Tokens of the compressed middle after a reduction: target - sink - window."""
        return self.target - self.sink - self.window

    def reset(self) -> None:
        """Start afresh (a new cache): a new session, every row's random stream back to ``seed``."""
        self.session += 1
        self._gens = None              # one torch.Generator per row, made at the first reduction
        self._layers: list = []        # the StreamingLayers of the current cache, by layer index
        self._scale = None             # the attention's logit scale
        self._queries: dict = {}       # layer -> (module, last position's hidden state, cos, sin) for error_bar
        self._checkpoint = None
        self.peak = 0                  # the most tokens a layer held during an attention call
        self.reductions = 0
        self._mid = 0                  # tokens in the compressed middle (every layer the same)
        self._vmax = None              # (layers, b, Hkv) the largest value norm absorbed into the middle

    # ------------------------------------------------------------------ hooks
    @contextmanager
    def __call__(self, model):
        require_weighted_attention(model)
        check_pipeline_call()
        lm = model.model.language_model if hasattr(model.model, "language_model") else model.model
        self._n_layers = int(model.config.num_hidden_layers)
        hooks = [layer.self_attn.register_forward_hook(self.forward_hook, with_kwargs=True) for layer in lm.layers]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()
            self._record_checkpoint()

    def forward_hook(self, module, input, kwargs, output):
        cache = cache_of(kwargs)
        if cache is None:
            return output
        idx = module.layer_idx
        hidden = kwargs["hidden_states"]
        if idx == 0 and not bool(torch.isfinite(hidden).all()):
            raise InputError("hidden_states contain NaN or inf: the streaming press cannot compress them")
        layer = cache.layers[idx]
        if not (isinstance(layer, StreamingLayer) and layer.press is self and layer.session == self.session):
            if idx == 0:                          # a new cache: the press's state starts afresh
                self.reset()
            layer = cache.layers[idx] = self._streaming_layer(layer, kwargs, idx)
        else:
            self._mark_padding(layer, kwargs)
        self._scale = float(getattr(module, "scaling", 1.0 / math.sqrt(module.head_dim)))
        cos, sin = kwargs["position_embeddings"]
        self._queries[idx] = (module, hidden[:, -1:].detach().clone(), cos[..., -1:, :].clone(),
                              sin[..., -1:, :].clone())
        stored = layer.stored_length
        self.peak = max(self.peak, stored)
        if self.observer is not None:
            self.observer(self, module, kwargs, layer)
        if idx == self._n_layers - 1 and stored >= self.target + self.interval:
            self._reduce()
        return output

    def _streaming_layer(self, layer, kwargs, idx: int) -> StreamingLayer:
        if getattr(layer, "keys", None) is None or layer.keys.shape[-2] != kwargs["hidden_states"].shape[1]:
            raise InputError("a streaming press must be entered before the first forward pass (it found a cache "
                             "filled without it)")
        k, v = layer.keys, layer.values
        b, n = k.shape[0], k.shape[2]
        vis = visible_tokens(kwargs.get("attention_mask"), b, n, k.device)
        a = torch.zeros(k.shape[:-1], dtype=torch.float32, device=k.device).masked_fill(~vis[:, None, :], -math.inf)
        out = StreamingLayer(k, v, a, a, logical_length=n, press=self, index=idx)
        while len(self._layers) <= idx:
            self._layers.append(None)
        self._layers[idx] = out
        return out

    @staticmethod
    def _mark_padding(layer, kwargs) -> None:
        """The tokens this pass appended that its attention mask hides (padding) get weight 0 (log-weight -inf)."""
        L = kwargs["hidden_states"].shape[1]
        vis = visible_tokens(kwargs.get("attention_mask"), layer.keys.shape[0], L, layer.keys.device)
        if bool(vis.all()):
            return
        a, b = log_weights(layer)
        same = b is a
        a = a.clone()
        a[..., -L:] = a[..., -L:].masked_fill(~vis[:, None, :], -math.inf)
        if same:
            b = a
        else:
            b = b.clone()
            b[..., -L:] = b[..., -L:].masked_fill(~vis[:, None, :], -math.inf)
        layer.log_w_num, layer.log_w_den, layer._split = a, b, None

    # ------------------------------------------------------------------ reductions
    def make_room(self, new: int) -> None:
        """Called by the first layer before it appends ``new`` tokens: reduce every layer now if they would hold more
        than target + interval (and a reduction can help: they hold more than target)."""
        if len(self._layers) != self._n_layers or any(l is None for l in self._layers):
            return                                   # the first forward pass is still converting the layers
        stored = self._layers[0].stored_length
        if stored + new > self.target + self.interval and stored > self.target:
            self._reduce()

    def uniform(self, rows: int, *shape) -> torch.Tensor:
        """(layers * rows * Hkv, *shape) float64 uniforms, each row's from its own stream (rows laid out as the
        stacked reduction lays them out: layer, row, KV head)."""
        L, H = len(self._layers), self._layers[0].keys.shape[1]
        draws = [torch.rand((L, H) + tuple(shape), generator=g, dtype=torch.float64) for g in self._gens]
        return torch.stack(draws, 1).reshape((L * rows * H,) + tuple(shape))

    def _reduce(self) -> None:
        layers = self._layers
        b, H, S, d = layers[0].keys.shape
        if self._gens is None:
            self._gens = [torch.Generator().manual_seed(self.seed) for _ in range(b)]
        if len(self._gens) != b:
            raise InputError(f"the batch changed from {len(self._gens)} to {b} rows between reductions: a "
                             "streaming press's state is per row (no beam search or batch selection)")
        flat = lambda x: torch.cat(list(x)).reshape(len(layers) * b * H, S, *x[0].shape[3:])
        K, V = flat([l.keys for l in layers]), flat([l.values for l in layers])
        A, Bw = flat([log_weights(l)[0] for l in layers]), flat([log_weights(l)[1] for l in layers])
        s, mid, w = self.sink, self._mid, self.window
        cut = (slice(None, s), slice(s, s + mid), slice(s + mid, S - w), slice(S - w, None))
        uniform = lambda *shape: self.uniform(b, *shape)
        Km, Vm, Am, Bm = self._reduce_middle(*(x[:, cut[1]] for x in (K, V, A, Bw)),
                                             *(x[:, cut[2]] for x in (K, V, A, Bw)), scale=self._scale,
                                             uniform=uniform)
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
            layer.compressed_length = S2
            layer._split = None
        self.reductions += 1

    def _reduce_middle(self, Km, Vm, Am, Bm, Kx, Vx, Ax, Bx, *, scale, uniform):
        raise NotImplementedError

    # ------------------------------------------------------------------ the state recorded on leaving the context
    def _state(self) -> dict:
        """The press's own state (copies), for :meth:`restore`; subclasses add theirs."""
        return dict(gens=None if self._gens is None else [g.get_state() for g in self._gens], mid=self._mid,
                    vmax=None if self._vmax is None else self._vmax.clone(), reductions=self.reductions)

    def _set_state(self, st: dict) -> None:
        if st["gens"] is not None:
            self._gens = [torch.Generator().set_state(g) for g in st["gens"]]
        else:
            self._gens = None
        self._mid, self.reductions = st["mid"], st["reductions"]
        self._vmax = None if st["vmax"] is None else st["vmax"].clone()

    def _record_checkpoint(self) -> None:
        if not self._layers or any(l is None for l in self._layers):
            return
        tensors = [(l.keys, l.values, l.log_w_num, l.log_w_den, l.dropped, l.compressed_length)
                   for l in self._layers]
        self._checkpoint = (self._layers[0].logical_length, self.session, tensors, self._state())

    def restore(self, logical_length: int) -> bool:
        """Return every layer and the press's state to what they were when the context was last left, if that was
        at ``logical_length`` tokens (kvpress's pipeline cutting an answer off); False otherwise."""
        cp = self._checkpoint
        if cp is None or cp[0] != logical_length or cp[1] != self.session:
            return False
        for layer, (k, v, a, b, dropped, compressed) in zip(self._layers, cp[2]):
            layer.keys, layer.values, layer.log_w_num, layer.log_w_den = k, v, a, b
            layer.dropped, layer.compressed_length, layer._split = dropped, compressed, None
        self._set_state(cp[3])
        return True

    # ------------------------------------------------------------------ reading the cache at a query
    def certificate(self, layer_idx: int, layer: WeightedLayer, q: torch.Tensor, scale: float,
                    kind: str | None = None) -> ErrorBar:
        """The error bar on the compressed attention output of layer ``layer_idx`` (``layer``, this press's layer)
        at post-RoPE queries ``q`` (b, H, d) with logit scale ``scale``: an :class:`ErrorBar` per row and query head
        (0 before the first reduction, when the cache is exact). ``kind``: "bound" (valid for every input) or
        "estimate" (a statistical bar, coverage measured); default the press's own :attr:`certificate_kind`."""
        kind = inputs.check_kind(self.certificate_kind if kind is None else kind)
        inputs.check_layer_query(self, layer_idx, layer, q, scale)
        return self._certificate(int(layer_idx), layer, q, float(scale), kind)

    certificate_kind: ClassVar[str] = "bound"

    def _certificate(self, layer_idx, layer, q, scale, kind) -> ErrorBar:
        raise NotImplementedError

    def error_bar(self, layer_idx: int | None = None, kind: str | None = None):
        """The error bar at the last query the model computed (the last position of the last forward pass inside
        the press's context): one :class:`ErrorBar` for ``layer_idx``, or a list over the layers; ``kind`` as in
        :meth:`certificate`. Needs a forward pass inside the context since the press last started a cache."""
        kind = inputs.check_kind(self.certificate_kind if kind is None else kind)
        if not self._queries or not self._layers:
            raise InputError("no query yet: run the model inside the press's context first")
        if layer_idx is None:
            return [self.error_bar(i, kind) for i in range(len(self._layers))]
        inputs.check_layer_index(self, layer_idx)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        module, hid, cos, sin = self._queries[int(layer_idx)]
        with torch.no_grad():
            b = hid.shape[0]
            qs = module.q_proj(hid).view(b, 1, -1, module.head_dim).transpose(1, 2)
            qs = apply_rotary_pos_emb(qs, qs, cos, sin)[0][:, :, -1]
        return self.certificate(int(layer_idx), self._layers[int(layer_idx)], qs, self._scale, kind)


def log_weights(layer: WeightedLayer):
    """(log_w_num, log_w_den) of a layer, zeros where it holds none (an exact layer)."""
    if layer.log_w_num is not None:
        return layer.log_w_num, layer.log_w_den
    z = torch.zeros(layer.keys.shape[:-1], dtype=torch.float32, device=layer.keys.device)
    return z, z


def weighted_output(layer: WeightedLayer, q: torch.Tensor, scale: float):
    """The cache's attention output at queries q (b, H, d): (sum e^{l+a} v / sum e^{l+b}) (b, H, e) float64, and
    log sum e^{l+b} (b, H), and the logits l = <q, k> scale (b, Hkv, H / Hkv, m) (the weighted attention's formula,
    for one query per head). A row that holds only padding has output 0 and log-denominator -inf."""
    inputs.check_query(layer, q, scale)
    b, H, d = q.shape
    Hkv = layer.keys.shape[1]
    qg = q.double().reshape(b, Hkv, H // Hkv, d)
    lg = torch.einsum("bgrd,bgmd->bgrm", qg, layer.keys.double()) * float(scale)
    if not bool(torch.isfinite(lg).all()):
        raise InputError("the logits <q, k> scale overflow float64 (q or scale too large for these keys)")
    a, bb = (x.double()[:, :, None] for x in log_weights(layer))
    ln = torch.logsumexp(lg + bb, -1)
    empty = ln == -math.inf                   # a row that has seen only padding: output 0, log-denominator -inf
    wn = torch.exp(lg + a - torch.where(empty, 0.0, ln)[..., None])
    out = torch.einsum("bgrm,bgme->bgre", wn, layer.values.double())
    if not bool(torch.isfinite(out).all()) or not bool(torch.isfinite(ln[~empty]).all()):
        raise InputError("the cache's output at this query lies beyond float64 (a numerator weight e^{l + a} "
                         "over the denominator's sum of e^{l + b} overflows: the query's logits are too large)")
    return out.reshape(b, H, -1), ln.reshape(b, H), lg
