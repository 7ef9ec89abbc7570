"""kvbounds' compressors as NVIDIA kvpress presses: ``with press(model): model.generate(...)`` or kvpress's
``"kv-press-text-generation"`` pipeline, with the per-token weights kept.

Each press is a ``kvpress.BasePress`` taking ``compression_ratio`` (the fraction of the cache's floats removed;
budget = 1 - ratio, the harness's budget), ``sink``, ``window`` and ``seed``. After each attention layer of the
prefill it compresses that layer's keys and values with the same code the end-to-end harness runs
(:func:`kvbounds.e2e.methods.compress_layer`, so equal seeds give equal caches) and replaces the layer by a
:class:`~kvbounds.e2e.weighted_cache.WeightedLayer` holding ``(K', V', a, b)`` and the logical length. The model
must run the weighted attention (``attn_implementation="kvbounds_weighted"``,
:func:`kvbounds.e2e.attention.use_weighted_attention`); entering a press on any other model raises
:class:`~kvbounds.e2e.weighted_cache.ModelNotWeighted`.

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
    raise ImportError(f"kvbounds.press needs torch, transformers and kvpress ({e}); "
                      "pip install 'kvbounds[hf,kvpress]'") from None

from kvbounds.algorithms import token_selection as ts
from kvbounds.e2e import methods
from kvbounds.e2e import kvpress_answers
from kvbounds.e2e.attention import register, require_weighted_attention, use_weighted_attention
from kvbounds.e2e.weighted_cache import ModelNotWeighted, WeightedCache, WeightedLayer
from kvbounds.e2e.weighted_cache import visible_tokens as _visible_tokens

__all__ = ["KVBoundsPress", "BalanceKVPress", "BalanceKVReleasedPress", "SubGenPress", "SubspacePress",
           "UniformPress", "KCenterPress", "H2OPress", "KernelThinningPress", "PRESSES", "WeightedLayer",
           "WeightedCache", "ModelNotWeighted", "use_weighted_attention"]

register()
kvpress_answers.install()          # the pipeline's multi-question path cuts weighted layers by their own crop


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
        with BasePress.__call__(self, model):
            yield

    def compress_row(self, module, K, V, rng, Q):
        """One row's K, V (Hkv, n, d) float32 -> :class:`~kvbounds.algorithms.token_selection.CompressedKV`."""
        return methods.compress_layer(self.method, K, V, self.budget, rng, sink=self.sink, window=self.window)

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
        visible = _visible_tokens(kwargs.get("attention_mask"), b, n, keys.device)
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


def _press(name: str, method: str, doc: str):
    cls = dataclasses.make_dataclass(name, [], bases=(KVBoundsPress,), namespace={"method": method, "__doc__": doc})
    cls.__module__ = __name__
    return cls


BalanceKVPress = _press("BalanceKVPress", "balancekv",
                        "Blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS App. B.1): sink and window "
                        "exact, the middle halved T times by the self-balancing walk, T the fewest that fit.")
BalanceKVReleasedPress = _press("BalanceKVReleasedPress", "balancekv_released",
                                "BalanceKV as the authors released it (their walk; a per token, b = T log 2).")
SubGenPress = _press("SubGenPress", "subgen", "SubGen's estimator (SubGen Alg. 1): k-center representatives for "
                     "the denominator, sampled values for the numerator (split weights a != b).")
SubspacePress = _press("SubspacePress", "subspace",
                       "Top-r projection of the middle keys/values (Subspace-FD-draft), exact sink and window.")
UniformPress = _press("UniformPress", "uniform",
                      "Sink and window exact, the middle sampled uniformly, weight n_mid / kept (unbiased).")
KernelThinningPress = _press("KernelThinningPress", "kernel_thinning",
                             "Sink and window exact, the middle by kernel thinning (goodpoints; the extra "
                             "kvbounds[kt]) in the softmax-times-value kernel, weight n_mid / kept.")


@dataclasses.dataclass
class KCenterPress(KVBoundsPress):
    """Greedy k-center of the keys plus the window (ClusterGen Sec. 4.1); weights 1, or with ``cluster_sized``
    each center weighted by the tokens it covers."""
    cluster_sized: bool = False

    @property
    def method(self) -> str:     # type: ignore[override]
        return "kcenter_sized" if self.cluster_sized else "kcenter"


@dataclasses.dataclass
class H2OPress(KVBoundsPress):
    """H2O (Zhang et al. 2023; the SubGen/ClusterGen baseline): greedy eviction by accumulated attention, the last
    ``window`` tokens always kept; weights 1. Each KV head is scored with its group's mean post-RoPE query."""
    method: ClassVar[str] = "h2o"
    needs_queries: ClassVar[bool] = True

    def compress_row(self, module, K, V, rng, Q):
        tokens = int(math.floor(self.budget * K.shape[-2] * 2 * K.shape[-1])) // (2 * K.shape[-1])
        return ts.H2O(recent=self.window).compress(K, V, budget=tokens, Q=Q)


PRESSES: dict[str, type[KVBoundsPress]] = {
    "balancekv": BalanceKVPress, "balancekv_released": BalanceKVReleasedPress, "subgen": SubGenPress,
    "subspace": SubspacePress, "uniform": UniformPress, "kcenter": KCenterPress, "h2o": H2OPress,
    "kernel_thinning": KernelThinningPress,
}
