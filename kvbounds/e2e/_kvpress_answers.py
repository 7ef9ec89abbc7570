"""kvpress's ``"kv-press-text-generation"`` pipeline over a weighted cache: each answer cut off at the right place.

The pipeline answers several questions on one compressed context by reading every layer's ``get_seq_length`` before
a question and slicing the layer's keys and values back to it after the answer
(``KVPressTextGenerationPipeline._remove_answer_from_cache``). For a
:class:`~kvbounds.e2e.WeightedLayer` that length is the logical one (tokens seen), larger than what
the layer stores, so the slice cut nothing: the first question and answer stayed in the cache for the second. And a
slice of the keys alone would leave the log-weights behind. :func:`install` wraps that method so that weighted
layers are cut by their own :meth:`~kvbounds.e2e.WeightedLayer.crop` to the logical length read
before the question (a streaming press's layer restores the state it had there); every other layer is cut by
kvpress's own code, unchanged.
"""
from __future__ import annotations

MARK = "_kvbounds_weighted_cut"


def install() -> bool:
    """Wrap the pipeline's answer cut (idempotent). Returns False when kvpress is not installed (nothing to do)."""
    try:
        from kvpress.pipeline import KVPressTextGenerationPipeline
    except ImportError:
        return False
    original = getattr(KVPressTextGenerationPipeline, "_remove_answer_from_cache", None)
    if original is None:       # a kvpress outside the extra's range (0.5.x): say so rather than answer wrongly
        import kvpress
        raise RuntimeError(f"kvpress {getattr(kvpress, '__version__', '?')}'s pipeline has no "
                           "_remove_answer_from_cache: kvbounds' weighted cache cannot cut its answers; install the "
                           "kvpress of kvbounds' 'kvpress' extra (kvpress>=0.5.5,<0.6)")
    if getattr(original, MARK, False):
        return True

    def remove_answer_from_cache(self, cache, cache_seq_lengths):
        from ._weighted_cache import WeightedLayer
        for layer, length in zip(cache.layers, cache_seq_lengths):
            if isinstance(layer, WeightedLayer):
                layer.crop(int(length))          # logical length: the answer's stored tokens (and weights) go
        return original(self, cache, cache_seq_lengths)   # no-op on weighted layers: they now store <= length

    setattr(remove_answer_from_cache, MARK, True)
    remove_answer_from_cache.__doc__ = original.__doc__
    KVPressTextGenerationPipeline._remove_answer_from_cache = remove_answer_from_cache
    return True
