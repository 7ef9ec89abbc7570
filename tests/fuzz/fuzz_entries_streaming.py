"""Fuzz entries of the streaming presses (kvbounds.presses._streaming) and of the weighted cache's newer helpers: the
presses'
options, ``generate``'s arguments, the error bar and ``weighted_output`` at a query, kvpress's pipeline hook.

The model-based entries run a tiny seeded Llama (2 layers, 4 query / 2 KV heads of 8) built once per worker,
outside the timed call, and a press with a cache after one generation (reused: reading an error bar does not
change the press). ``NOT_ENTRY_POINTS`` lists the public callables of these modules that are reached through the
entries (the press's internal steps on its own checked state, the argument checks themselves), each with its
reason; tests/fuzz/test_fuzz.py adds them to its exclusions."""
from __future__ import annotations

import functools
import math

import numpy as np

from fuzz_harness import Entry, as_numpy, make_array

PRESS_PARAMS = dict(target=40, interval=8, sink=2, window=4, seed=3, clusters=4, per_cluster=0)


def _warm():
    import kvbounds.presses._streaming  # noqa: F401 - imports transformers outside the timed call


@functools.lru_cache(maxsize=1)
def tiny_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from kvbounds.e2e import use_weighted_attention
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval()
    use_weighted_attention(model)
    return model


@functools.lru_cache(maxsize=2)
def pressed(name: str):
    """A press of class ``name`` after one generation of 30 + 12 tokens (several reductions), and its model."""
    import torch
    from kvbounds.presses._streaming import StreamingBalanceKVPress, StreamingSubGenPress
    from kvbounds.presses._streaming import generate
    cls = {"bkv": StreamingBalanceKVPress, "sg": StreamingSubGenPress}[name]
    kw = dict(target=24, interval=6, sink=2, window=4, seed=1)
    press = cls(**kw, **({"clusters": 2} if name == "sg" else {}))
    generate(tiny_model(), press, torch.arange(30).remainder(64)[None].long(), 12)
    return press


# -- the presses' options ----------------------------------------------------------------------------------------

def _press_arrays(rng, cls):
    _warm()
    return {}


def _press_call(target, interval, sink, window, seed, clusters, per_cluster):
    from kvbounds.presses._streaming import StreamingBalanceKVPress, StreamingPress, StreamingSubGenPress
    kw = dict(target=target, interval=interval, sink=sink, window=window, seed=seed)
    a = StreamingBalanceKVPress(**kw)
    b = StreamingSubGenPress(**kw, clusters=clusters, per_cluster=per_cluster)
    StreamingPress(**kw)
    return a.middle, b.middle


# -- generate ----------------------------------------------------------------------------------------------------

def _generate_arrays(rng, cls):
    _warm()
    tiny_model()
    b, n = int(rng.integers(1, 3)), int(rng.integers(1, 20))
    mask = np.ones((b, n), dtype=np.int64)
    for r in range(b):
        p = int(rng.integers(0, n))
        if rng.random() < 0.5:
            mask[r, :p] = 0
        elif p:
            mask[r, -p:] = 0
    return dict(input_ids=rng.integers(0, 64, (b, n)), attention_mask=mask)


def _tensor(x):
    import torch
    return torch.as_tensor(x) if isinstance(x, np.ndarray) and x.dtype.kind in "fiub" else x


def _generate_call(input_ids, attention_mask, max_new_tokens, chunk, press):
    from kvbounds.presses._streaming import StreamingBalanceKVPress, StreamingSubGenPress
    from kvbounds.presses._streaming import generate
    p = {"bkv": StreamingBalanceKVPress, "sg": StreamingSubGenPress}.get(press, press)
    p = p(target=24, interval=6, sink=2, window=4) if isinstance(p, type) else p
    return generate(tiny_model(), p, _tensor(input_ids), max_new_tokens, chunk=chunk,
                    attention_mask=_tensor(attention_mask))


def _check_generate(out, input_ids, attention_mask, max_new_tokens, **kw):
    out = np.asarray(as_numpy(out))
    want = (input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
    if out.shape != want:
        return f"shape {out.shape}, want {want}"
    if not np.array_equal(out[:, :input_ids.shape[1]], input_ids):
        return "the input ids are not kept as given"
    return None if out.min() >= 0 and out.max() < 64 else "a token outside the vocabulary"


# -- the error bar and weighted_output at a query --------------------------------------------------------------------

def _query_arrays(rng, cls):
    _warm()
    pressed("bkv"), pressed("sg")
    return dict(q=make_array(rng, (1, 4, 8), cls))


def _certificate_entry(press: str):
    def call(q, layer_idx, scale):
        return _certificate_call(q, layer_idx, scale, pressed(press))
    return call


def _certificate_call(q, layer_idx, scale, p):
    layer = p._layers[layer_idx] if isinstance(layer_idx, int) and 0 <= layer_idx < len(p._layers) else None
    q = _tensor(q)
    bar = p.certificate(layer_idx, layer, q, scale)
    out, logz, _ = __import__("kvbounds.presses._streaming", fromlist=["x"]).weighted_output(layer, q, scale)
    return bar.kind, bar.log_value, bar.value, bar.trivial, bar.vacuous, out, logz, str(bar), p.error_bar(0).kind


def _check_certificate(out, q, layer_idx, scale):
    kind, log_value, value, trivial = out[:4]
    log_value, value, trivial = (np.asarray(as_numpy(x)) for x in (log_value, value, trivial))
    if kind not in ("bound", "estimate"):
        return f"kind {kind!r}"
    if np.isnan(log_value).any() or (log_value == np.inf).any():
        return "a NaN or +inf log"
    if kind == "bound" and not np.all(value <= trivial * (1 + 1e-12)):
        return "a bound above the trivial bar"
    return None


def _certificate_nonfinite_ok(out, **kw):
    """Documented non-finite entries: log_value is -inf where the bar is 0 (an exact cache); value and the cache's
    output are finite for any finite query (capped bounds; an estimate beyond float64 is +inf only in ``value``)."""
    kind, log_value, value, trivial, vacuous, o, logz = out[:7]
    lv = np.asarray(as_numpy(log_value))
    return bool(np.all(np.isfinite(lv) | (lv == -np.inf)) and np.all(np.isfinite(as_numpy(o)))
                and np.all(np.isfinite(as_numpy(trivial))))


def _weighted_output_call(q, scale, layer):
    from kvbounds.presses._streaming import weighted_output
    p = pressed("sg")
    lay = p._layers[0] if layer == "press" else layer
    return weighted_output(lay, _tensor(q), scale)[:2]


def _answers_call():
    """The scoped pipeline fix: nested blocks restore kvpress's own method on exit; the subclass carries the fix."""
    from kvpress.pipeline import KVPressTextGenerationPipeline as K
    from kvbounds.e2e import _kvpress_answers as kvpress_answers
    own = K.__dict__["_remove_answer_from_cache"]
    with kvpress_answers.weighted_answers(), kvpress_answers.weighted_answers():
        inside = K.__dict__["_remove_answer_from_cache"] is not own
    assert inside and K.__dict__["_remove_answer_from_cache"] is own
    return kvpress_answers.pipeline_class().__name__


ENTRIES = [
    Entry("StreamingPress+StreamingBalanceKVPress+StreamingSubGenPress", _press_arrays, dict(PRESS_PARAMS), _press_call),
    Entry("generate[streaming]", _generate_arrays, dict(max_new_tokens=3, chunk=None, press="bkv"), _generate_call,
          _check_generate, torch_ok=False),
    Entry("generate[streaming, subgen, chunk 2]", _generate_arrays, dict(max_new_tokens=2, chunk=2, press="sg"),
          _generate_call, _check_generate, torch_ok=False),
    Entry("certificate+error_bar+ErrorBar+weighted_output[balancekv]", _query_arrays,
          dict(layer_idx=1, scale=1 / math.sqrt(8)), _certificate_entry("bkv"), _check_certificate,
          nonfinite_ok=_certificate_nonfinite_ok),
    Entry("certificate+error_bar+ErrorBar+weighted_output[subgen]", _query_arrays,
          dict(layer_idx=0, scale=1 / math.sqrt(8)), _certificate_entry("sg"), _check_certificate,
          nonfinite_ok=_certificate_nonfinite_ok),
    Entry("weighted_output", _query_arrays, dict(scale=0.35, layer="press"), _weighted_output_call),
    Entry("kvpress_answers.weighted_answers+pipeline_class", lambda r, c: {}, {}, _answers_call),
]

# Public callables of kvbounds.presses._streaming and of the weighted cache's helpers that are not entries, with the
# reason.
NOT_ENTRY_POINTS = {
    # the merge-and-reduce's steps and SubGen's online state: the press calls them on its own stacked, checked
    # state (reached through the generate / certificate entries; tests/presses/test_streaming_invariants.py checks them)
    "pair_gram", "walk_signs", "WalkSums", "merge_pair_rule", "halve_pairs", "merge_unequal", "reduce_middle",
    # the layer a press's hook builds from the cache it was given (reached through generate)
    "StreamingLayer",
    # the argument checks themselves (run by every entry above)
    "count", "check_scale", "check_query", "check_layer_index", "check_layer_query", "check_generate", "check_kind",
    # the ErrorBar's constructors from a press's computed logs (reached through the certificate entries)
    "trivial_bar", "capped",
    # small readers of a transformers object: which keyword a model's forward takes its cache by, the cache an
    # attention call was given, a layer's log-weights (reached through generate)
    "cache_keyword", "cache_of", "log_weights",
    # the last n visible tokens from a transformers 4-d mask (the press hooks' reader; reached through generate)
    "visible_tokens",
    # kvpress's pipeline on a model, and its answer cut (a transformers pipeline on a model: tests/presses/test_press.py
    # asks it several questions, tiny model and SmolLM2)
    "pipeline", "cut_answer",
}
