"""kvpress's ``"kv-press-text-generation"`` pipeline over a weighted cache: each answer cut off at the right place,
without changing kvpress for anyone else.

The pipeline answers several questions on one compressed context by reading every layer's ``get_seq_length`` before
a question and slicing the layer's keys and values back to it after the answer
(``KVPressTextGenerationPipeline._remove_answer_from_cache``). For a :class:`~kvbounds.e2e.WeightedLayer` that
length is the logical one (tokens seen), larger than what the layer stores, so the slice cut nothing: the first
question and answer stayed in the cache for the second. And a slice of the keys alone would leave the log-weights
behind. The fix (:func:`cut_answer`): weighted layers are cut by their own :meth:`~kvbounds.e2e.WeightedLayer.crop`
to the logical length read before the question (a streaming press's layer restores the state it had there); every
other layer is cut by kvpress's own code, unchanged.

Where it is active, and nowhere else (importing kvbounds changes nothing in kvpress):

* :func:`pipeline_class` / :func:`pipeline`: a subclass of kvpress's pipeline whose cut is the fix (the way to
  answer several questions with a kvbounds press);
* :func:`weighted_answers`: a context manager for a kvpress pipeline built elsewhere: the class's cut is the fix
  inside the block, kvpress's own method again on exit (nesting and threads counted);
* :func:`check_pipeline_call`, called by kvbounds' presses when kvpress's pipeline enters them: a plain kvpress
  pipeline asked several questions outside both is refused with one line naming the two ways (it would answer
  the second question with the first answer still in the cache).

Proposed upstream (docs/kvpress_pipeline_fix.md): let a cache layer cut itself (``layer.crop(length)`` where the
layer has one, the slice otherwise), which is exactly :func:`cut_answer`.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading

__all__ = ["cut_answer", "pipeline_class", "pipeline", "weighted_answers", "check_pipeline_call"]

_LOCK = threading.Lock()
_DEPTH = [0]
_ORIGINAL: list = []
MARK = "_kvbounds_weighted_cut"


def _kvpress_pipeline():
    """kvpress's pipeline class, checked to have the method the fix wraps (kvpress 0.5.x)."""
    from kvpress.pipeline import KVPressTextGenerationPipeline
    if getattr(KVPressTextGenerationPipeline, "_remove_answer_from_cache", None) is None:
        import kvpress
        raise RuntimeError(f"kvpress {getattr(kvpress, '__version__', '?')}'s pipeline has no "
                           "_remove_answer_from_cache: kvbounds' weighted cache cannot cut its answers; install the "
                           "kvpress of kvbounds' 'kvpress' extra (kvpress>=0.5.5,<0.6)")
    return KVPressTextGenerationPipeline


def cut_answer(original, pipe, cache, cache_seq_lengths) -> None:
    """The fix: every weighted layer cropped to its logical length before the question (the answer's stored tokens
    and weights go), then kvpress's ``original`` cut (a no-op on weighted layers: they now store <= that length)."""
    from ._weighted_cache import WeightedLayer
    for layer, length in zip(cache.layers, cache_seq_lengths):
        if isinstance(layer, WeightedLayer):
            layer.crop(int(length))
    return original(pipe, cache, cache_seq_lengths)


@functools.lru_cache(maxsize=1)
def pipeline_class():
    """``KVBoundsTextGenerationPipeline``: kvpress's pipeline with :func:`cut_answer` as its answer cut."""
    base = _kvpress_pipeline()

    def _remove_answer_from_cache(self, cache, cache_seq_lengths):
        return cut_answer(base._remove_answer_from_cache, self, cache, cache_seq_lengths)

    _remove_answer_from_cache.__doc__ = base._remove_answer_from_cache.__doc__
    setattr(_remove_answer_from_cache, MARK, True)
    return type("KVBoundsTextGenerationPipeline", (base,), {
        "__doc__": "kvpress's text-generation pipeline whose answer cut crops kvbounds' weighted layers "
                   "(kvbounds.e2e._kvpress_answers).", "__module__": __name__,
        "_remove_answer_from_cache": _remove_answer_from_cache})


def pipeline(model, tokenizer, **kw):
    """:func:`pipeline_class` built on ``model`` and ``tokenizer`` (what ``transformers.pipeline(
    "kv-press-text-generation", model=..., tokenizer=...)`` builds, with the fix)."""
    return pipeline_class()(model=model, tokenizer=tokenizer, **kw)


@contextlib.contextmanager
def weighted_answers():
    """Inside the block, kvpress's pipeline class cuts answers with :func:`cut_answer`; on exit (the outermost block
    of any thread) its own method is back."""
    cls = _kvpress_pipeline()
    with _LOCK:
        if _DEPTH[0] == 0:
            original = cls.__dict__["_remove_answer_from_cache"]
            _ORIGINAL[:] = [original]

            def _remove_answer_from_cache(self, cache, cache_seq_lengths):
                return cut_answer(original, self, cache, cache_seq_lengths)

            setattr(_remove_answer_from_cache, MARK, True)
            _remove_answer_from_cache.__doc__ = original.__doc__
            cls._remove_answer_from_cache = _remove_answer_from_cache
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                cls._remove_answer_from_cache = _ORIGINAL.pop()


def check_pipeline_call() -> None:
    """Called as a kvbounds press is entered: when kvpress's pipeline (``_forward``) entered it with several
    questions and its answer cut is kvpress's own, raise (one line saying what to use instead). Anything else
    (``model.generate``, one question, :func:`pipeline`, inside :func:`weighted_answers`) passes."""
    mod = sys.modules.get("kvpress.pipeline")
    if mod is None:
        return
    base = getattr(mod, "KVPressTextGenerationPipeline", None)
    forward = getattr(getattr(base, "_forward", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not forward:
        frame = frame.f_back
    if frame is None:
        return
    pipe, inputs = frame.f_locals.get("self"), frame.f_locals.get("input_tensors") or {}
    if len(inputs.get("questions_ids", ())) < 2:
        return
    if getattr(getattr(type(pipe), "_remove_answer_from_cache", None), MARK, False):
        return
    raise RuntimeError("kvpress's pipeline cannot answer several questions over a kvbounds press's weighted cache "
                       "(its answer cut leaves the first answer in the cache): build the pipeline with "
                       "kvbounds.presses.pipeline(model, tokenizer), or call it inside "
                       "`with kvbounds.presses.weighted_answers():`")
