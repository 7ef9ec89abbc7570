"""kvbounds' compressors as NVIDIA kvpress presses: ``with press(model): model.generate(...)`` or kvpress's
``"kv-press-text-generation"`` pipeline, with the per-token weights kept (several questions on one context:
:func:`pipeline`, kvpress's pipeline with the answer cut a weighted cache needs, or kvpress's own inside
``with weighted_answers():``; :mod:`kvbounds.e2e._kvpress_answers`).

Each press is a ``kvpress.BasePress`` taking ``compression_ratio`` (the fraction of the cache's floats removed;
budget = 1 - ratio, the harness's budget), ``sink``, ``window`` and ``seed``. After each attention layer of the
prefill it compresses that layer's keys and values with the same code the end-to-end harness runs
(:func:`kvbounds.e2e.compress_layer`, so equal seeds give equal caches) and replaces the layer by a
:class:`~kvbounds.e2e.WeightedLayer` holding ``(K', V', a, b)`` and the logical length. The model
must run the weighted attention (``attn_implementation="kvbounds_weighted"``,
:func:`kvbounds.e2e.use_weighted_attention`); entering a press on any other model raises
:class:`~kvbounds.e2e.ModelNotWeighted`.

Batches: each row is compressed alone from its own tokens (padding, read from the attention mask, is left out)
with its own random stream seeded by ``seed``, so a row gives the same cache in a batch as alone; rows kept to
different sizes are padded with a = b = -inf.

Presses (the paper each implements; the claims whose checks run the same compressor):

* :class:`BalanceKVPress` - blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS, App. B.1; BKV.e2e);
* :class:`BalanceKVReleasedPress` - the authors' released walk (BalanceKV-NeurIPS code; BKV.e2e "released");
* :class:`SubGenPress` - SubGen's estimator, split numerator/denominator weights (SubGen Alg. 1; SG.e2e);
* :class:`SubspacePress` - top-r projection of the middle keys/values (Subspace-FD-draft);
* :class:`UniformPress`, :class:`KCenterPress` (ClusterGen Sec. 4.1; ``cluster_sized=True`` weights each center
  by its cluster's size), :class:`H2OPress` (H2O, the SubGen/ClusterGen baseline; with GQA each KV head is
  scored with the mean query of its group).
"""
from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import ClassVar

import numpy as np

from kvbounds.algorithms.validation import InputError

try:
    import torch
    from kvpress import BasePress
    from kvpress.presses.base_press import is_prefilling
except ImportError as e:          # the presses need the extras: pip install 'kvbounds[hf,kvpress]'
    raise ImportError(f"kvbounds.presses._kvpress needs torch, transformers and kvpress ({e}); "
                      "pip install 'kvbounds[hf,kvpress]'") from None

from kvbounds import methods as registry
from kvbounds.e2e import compress_layer
from kvbounds.e2e import check_pipeline_call, pipeline, weighted_answers
from kvbounds.e2e import register, require_weighted_attention, use_weighted_attention
from kvbounds.e2e import ModelNotWeighted, WeightedCache, WeightedLayer
from kvbounds.e2e import visible_tokens

register()


@dataclasses.dataclass
class KVBoundsPress(BasePress):
    """A kvbounds compressor as a kvpress press (see the module docstring). ``method``: the harness's method name."""
    compression_ratio: float = 0.5
    sink: int = 32
    window: int = 32
    seed: int = 0
    method: ClassVar[str] = ""

    def __post_init__(self):
        r = self.compression_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0.0 <= r < 1.0):
            raise InputError(f"compression_ratio must be a number in [0, 1), got {r!r}")
        for name in ("sink", "window", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InputError(f"{name} must be a non-negative integer, got {v!r}")
        self._rngs: list = []

    @property
    def budget(self) -> float:
        return 1.0 - float(self.compression_ratio)

    @contextmanager
    def __call__(self, model):
        require_weighted_attention(model)
        check_pipeline_call()      # kvpress's own pipeline asked several questions: refused, saying what to use
        with BasePress.__call__(self, model):
            yield

    def compress_row(self, module, K, V, rng, Q):
        """One row's K, V (Hkv, n, d) float32 (and its KV groups' mean queries ``Q`` when the method reads them)
        -> :class:`~kvbounds.algorithms.token_selection.CompressedKV`, by the registered method's ``compress`` at
        ``floor(budget n 2d)`` floats per KV head."""
        return compress_layer(self.method, K, V, self.budget, rng, sink=self.sink, window=self.window, Q=Q)

    needs_queries: ClassVar[bool] = False

    def forward_hook(self, module, input, kwargs, output):
        hidden = kwargs["hidden_states"]
        cache = kwargs.get("past_key_values")
        if cache is None or not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
            return output
        idx = module.layer_idx
        layer = cache.layers[idx]
        if isinstance(layer, WeightedLayer) or self.compression_ratio == 0:
            return output
        keys, values = layer.keys, layer.values
        b, n = keys.shape[0], keys.shape[2]
        if idx == 0 or len(self._rngs) != b:
            self._rngs = [np.random.default_rng(self.seed) for _ in range(b)]
        visible = visible_tokens(kwargs.get("attention_mask"), b, n, keys.device)
        Q = _group_queries(module, hidden, kwargs) if self.needs_queries else None
        with torch.no_grad():
            rows = []
            for r in range(b):
                sel = visible[r]
                K, V = keys[r][:, sel].float(), values[r][:, sel].float()
                rows.append(self.compress_row(module, K, V, self._rngs[r], None if Q is None else Q[r][:, sel]))
            cache.layers[idx] = _stack(rows, n, keys.dtype)
        return output


def _group_queries(module, hidden, kwargs):
    """Post-RoPE queries averaged over each KV group's query heads: (b, Hkv, n, d) float32."""
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    q = get_prerope_query_states(module, hidden)
    cos, sin = kwargs["position_embeddings"]
    q = apply_rotary_pos_emb(q, q, cos, sin)[0]
    b, H, n, d = q.shape
    Hkv = module.config.num_key_value_heads
    return q.float().view(b, Hkv, H // Hkv, n, d).mean(2)


def _stack(rows: list, n: int, dtype) -> WeightedLayer:
    """Per-row CompressedKV (torch) -> one WeightedLayer, rows padded to the longest with a = b = -inf."""
    m = max(int(c.keys.shape[-2]) for c in rows)
    pad = lambda x, fill: torch.nn.functional.pad(x, (0, 0, 0, m - x.shape[-2]), value=fill) if x.ndim == 3 \
        else torch.nn.functional.pad(x, (0, m - x.shape[-1]), value=fill)
    t = lambda x: x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    K = torch.stack([pad(t(c.keys), 0.0) for c in rows]).to(dtype)
    V = torch.stack([pad(t(c.values), 0.0) for c in rows]).to(dtype)
    a = torch.stack([pad(t(c.log_w_num).float(), -math.inf) for c in rows])
    b = torch.stack([pad(t(c.log_w_den).float(), -math.inf) for c in rows])
    return WeightedLayer(K, V, a, b, logical_length=n)


def press_class(name: str) -> type[KVBoundsPress]:
    """The press class ``name`` of the method registry's entries (:mod:`kvbounds.methods`: each entry naming a
    press): a :class:`KVBoundsPress` running that method, its docstring the entry's label; a press that several
    entries name (with ``press_options``) gets those options as dataclass fields and runs the entry they select."""
    entries = registry.methods(press=name, source="kvbounds")
    if not entries:
        raise KeyError(f"no registered method names the press {name!r}")
    first = entries[0]
    ns = {"__doc__": f"{first.label[:1].upper()}{first.label[1:]} (method {first.name!r}; :mod:`kvbounds.methods`).",
          "needs_queries": first.needs_queries}
    options = sorted({k for m in entries for k, _ in m.press_options})
    if options:
        defaults = dict(first.press_options)
        fields = [(k, type(defaults[k]), dataclasses.field(default=defaults[k])) for k in options]
        ns["method"] = property(lambda self: registry.press_method(name, **{k: getattr(self, k) for k in options}))
    else:
        fields = []
        ns["method"] = first.name
    cls = dataclasses.make_dataclass(name, fields, bases=(KVBoundsPress,), namespace=ns)
    cls.__module__ = __name__
    return cls


# One class per press a registered method of ours names (its ``press`` field), built from the registry in one loop:
# a method module of kvbounds.catalog that names a new press gets its class here, and kvbounds.presses names it.
# PRESSES: the end-to-end method each press runs by default -> its class.
PRESSES: dict[str, type[KVBoundsPress]] = {}
for _press in dict.fromkeys(m.press for m in registry.methods(source="kvbounds") if m.press):
    globals()[_press] = press_class(_press)
    PRESSES[globals()[_press]().method] = globals()[_press]
del _press

__all__ = ["KVBoundsPress", "press_class", "PRESSES", "WeightedLayer", "WeightedCache", "ModelNotWeighted",
           "use_weighted_attention", "pipeline", "weighted_answers"] + [cls.__name__ for cls in PRESSES.values()]
