"""Real traces, part three (see :mod:`kvbounds.traces.real`): loading a cached (or newly extracted) layer and
head as a :class:`kvbounds.traces.synthetic.Trace`, and the trace specs the checks put in their params
(``"smollm2:L3:H0:1024"``, ``"synthetic:<kind>:<n>:<d>"``) with their synthetic fallback."""
from __future__ import annotations

import re

import numpy as np

from kvbounds.algorithms.validation import InputError

from .real_cache import MODEL_INFO, MODELS, check_model, available
from .smollm2 import ModelUnavailable
from .synthetic import Trace, make_trace

__all__ = ["extract", "load_layer", "head_arrays", "load_trace", "parse_spec", "trace_from_spec", "traces_from_spec",
           "real_or_synthetic_spec", "clusterability_traces", "layer_heads", "kv_heads"]


def extract(*args, **kw):
    """:func:`kvbounds.traces.real.extract` (imported when called: that module imports this one)."""
    from .real import extract as _extract
    return _extract(*args, **kw)


def _cached(*args, **kw):
    from .real import cached_extraction as _c
    return _c(*args, **kw)


def load_layer(model: str, layer: int, n_tokens: int, *, text=None, cache_dir=None, prefetch="all") -> tuple[dict, dict]:
    """(float32 arrays of one layer, sidecar meta), extracting into the cache if needed. A missing extraction
    captures ``prefetch`` too (default: every layer, since the forward pass costs the same), so the next
    layer asked for is already cached."""
    check_model(model)
    cached = _cached(model, n_tokens, text, cache_dir)
    if cached is not None and int(layer) in cached.layers:
        return cached.layer(int(layer)), cached.meta
    if prefetch == "all":
        want = list(range(MODEL_INFO[model]["n_layers"]))
    else:
        want = sorted({int(layer), *(int(l) for l in (prefetch or []))})
    ex = extract(model, n_tokens, layers=want, text=text, cache_dir=cache_dir)
    return ex.layer(int(layer)), ex.meta


def head_arrays(model: str, arrays: dict, head: int, rope: str):
    H, Hkv = MODEL_INFO[model]["n_heads"], MODEL_INFO[model]["n_kv_heads"]
    kv = head // (H // Hkv)
    if model == "smollm2":
        if rope not in ("pre", "post"):
            raise InputError(f"rope must be 'pre' or 'post' for smollm2, got {rope!r}")
        return arrays[f"q_{rope}"][:, head], arrays[f"k_{rope}"][:, kv], arrays["v"][:, kv], kv
    return arrays["q"][:, head], arrays["k"][:, kv], arrays["v"][:, kv], kv


def load_trace(model: str, layer: int, head: int, n_tokens: int, *, rope: str = "post", text=None,
               cache_dir=None) -> Trace:
    """One (layer, query head) trace as a :class:`kvbounds.traces.synthetic.Trace`: Q (n, d) of query head ``head``,
    K, V (n, d) of the KV head it reads (h // 3 for SmolLM2), float64. ``rope``: "post" (what attention
    sees; default) or "pre" for SmolLM2; ignored for MiniLM (absolute positions: meta says "none")."""
    check_model(model)
    info = MODEL_INFO[model]
    if not 0 <= int(head) < info["n_heads"]:
        raise InputError(f"{model} has query heads 0..{info['n_heads'] - 1}, got head {head}")
    arrays, meta = load_layer(model, layer, n_tokens, text=text, cache_dir=cache_dir)
    rope = rope if model == "smollm2" else "none"
    Q, K, V, kv = head_arrays(model, arrays, int(head), rope)
    spec = f"{model}:L{int(layer)}:H{int(head)}:{int(n_tokens)}" + (":pre" if rope == "pre" else "")
    return Trace(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), dict(
        kind="real", model=model, layer=int(layer), head=int(head), kv_head=kv, pre_or_post_rope=rope,
        n=int(n_tokens), d=int(Q.shape[1]), s=int(V.shape[1]), spec=spec, text_source=meta["text_source"],
        text_hash=meta["text_hash"], file_hash=meta["file_hash"], causal=info["causal"],
        segments=meta.get("segments", [0]), positions=info["positions"]))


_SPEC = re.compile(r"^(?P<model>smollm2|minilm):L(?P<layer>\d+)(?::H(?P<head>\d+))?:(?P<n>\d+)(?::(?P<rope>pre|post))?$")
_SYN = re.compile(r"^synthetic:(?P<kind>[a-z_]+):(?P<n>\d+):(?P<d>\d+)(?::(?P<seed>\d+))?$")


def parse_spec(spec: str) -> dict:
    """``"smollm2:L3:H0:1024[:pre|post]"`` (H omitted: every head) or ``"synthetic:<kind>:<n>:<d>[:<seed>]"``."""
    if not isinstance(spec, str):
        raise InputError(f"a trace spec is a string like 'smollm2:L3:H0:1024', got {spec!r}")
    m = _SPEC.match(spec.strip())
    if m:
        g = m.groupdict()
        return dict(model=g["model"], layer=int(g["layer"]), head=None if g["head"] is None else int(g["head"]),
                    n=int(g["n"]), rope=g["rope"] or ("post" if g["model"] == "smollm2" else "none"))
    m = _SYN.match(spec.strip())
    if m:
        g = m.groupdict()
        return dict(model="synthetic", kind=g["kind"], n=int(g["n"]), d=int(g["d"]), seed=int(g["seed"] or 0))
    raise InputError(f"bad trace spec {spec!r}: expected 'smollm2:L<layer>:H<head>:<n>[:pre|post]', "
                     f"'minilm:L<layer>:H<head>:<n>' or 'synthetic:<kind>:<n>:<d>[:<seed>]'")


def trace_from_spec(spec: str, *, missing: str = "raise", text=None, cache_dir=None) -> Trace | None:
    """The Trace a spec names. When the model package is missing: raise :class:`ModelUnavailable`
    (``missing="raise"``) or return None (``missing="none"``)."""
    p = parse_spec(spec)
    if p["model"] == "synthetic":
        tr = make_trace(p["kind"], n=p["n"], d=p["d"], seed=p["seed"])
        tr.meta.update(spec=spec, pre_or_post_rope="none", model="synthetic")
        return tr
    if p["head"] is None:
        raise InputError(f"trace spec {spec!r} names no head: use traces_from_spec for every head, or add ':H<head>'")
    try:
        return load_trace(p["model"], p["layer"], p["head"], p["n"], rope=p["rope"] if p["model"] == "smollm2" else "post",
                          text=text, cache_dir=cache_dir)
    except ModelUnavailable:
        if missing == "none":
            return None
        raise


def traces_from_spec(spec: str, *, missing: str = "raise", text=None, cache_dir=None) -> list[Trace] | None:
    """Every query head's Trace for a head-less spec (``"smollm2:L3:1024"``), or the one head named."""
    p = parse_spec(spec)
    if p["model"] == "synthetic" or p["head"] is not None:
        tr = trace_from_spec(spec, missing=missing, text=text, cache_dir=cache_dir)
        return None if tr is None else [tr]
    try:
        return [load_trace(p["model"], p["layer"], h, p["n"], rope=p["rope"] if p["model"] == "smollm2" else "post",
                           text=text, cache_dir=cache_dir) for h in range(MODEL_INFO[p["model"]]["n_heads"])]
    except ModelUnavailable:
        if missing == "none":
            return None
        raise


def real_or_synthetic_spec(spec: str, *, kind: str = "gaussian", seed: int = 0) -> tuple[str, str | None]:
    """(spec to use, reason for the fallback or None): the real spec when its model loads here, else a
    synthetic spec of the same n and head dimension (what checks put in their params)."""
    p = parse_spec(spec)
    if p["model"] == "synthetic":
        return spec, None
    why = available(p["model"])
    if why is None:
        return spec, None
    return f"synthetic:{kind}:{p['n']}:{MODEL_INFO[p['model']]['head_dim']}:{seed}", why


def clusterability_traces(n_tokens: int = 512, *, models=MODELS, layers=None, heads=None, rope: str = "post",
                          missing: str = "skip", cache_dir=None) -> list[Trace]:
    """Real traces for the SG.clusterability comparison (keys vs values; RoPE vs absolute positions).

    One Trace per (model, layer, query head); ``layers``/``heads`` default to all (a dict model -> list
    narrows per model). Each trace's ``meta['spec']`` is the spec to record in params. A model whose
    package is missing is skipped (``missing="skip"``) or raises (``missing="raise"``)."""
    out = []
    for model in models:
        why = available(model)
        if why:
            if missing == "raise":
                raise ModelUnavailable(why)
            continue
        info = MODEL_INFO[model]
        ls = layers.get(model) if isinstance(layers, dict) else layers
        hs = heads.get(model) if isinstance(heads, dict) else heads
        ls = list(range(info["n_layers"])) if ls is None else list(ls)
        hs = list(range(info["n_heads"])) if hs is None else list(hs)
        extract(model, n_tokens, layers=ls, cache_dir=cache_dir)
        out += [load_trace(model, l, h, n_tokens, rope=rope, cache_dir=cache_dir) for l in ls for h in hs]
    return out


def layer_heads(spec: str, *, n_synthetic_heads: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Every query head of a layer as float64 (H, n, d) arrays Q, K, V (K/V repeated per query head under
    grouped-query attention, so head h of K is KV head h // 3 for SmolLM2), and the sidecar-derived meta.

    ``spec``: ``"smollm2:L3:2048[:pre]"``, ``"minilm:L2:512"``, or a synthetic spec (then
    ``n_synthetic_heads`` traces with seeds seed, seed+1, ...)."""
    p = parse_spec(spec)
    if p["model"] == "synthetic":
        trs = [make_trace(p["kind"], n=p["n"], d=p["d"], seed=p["seed"] + h) for h in range(n_synthetic_heads)]
        st = lambda a: np.stack([getattr(t, a) for t in trs])
        return st("Q"), st("K"), st("V"), dict(model="synthetic", kind=p["kind"], spec=spec, causal=True,
                                               segments=[0], pre_or_post_rope="none")
    model, info = p["model"], MODEL_INFO[p["model"]]
    arrays, meta = load_layer(model, p["layer"], p["n"])
    rope = p["rope"] if model == "smollm2" else "none"
    qk = (arrays[f"q_{rope}"], arrays[f"k_{rope}"]) if model == "smollm2" else (arrays["q"], arrays["k"])
    rep = info["n_heads"] // info["n_kv_heads"]
    Q = qk[0].transpose(1, 0, 2).astype(np.float64)
    K = np.repeat(qk[1].transpose(1, 0, 2), rep, axis=0).astype(np.float64)
    V = np.repeat(arrays["v"].transpose(1, 0, 2), rep, axis=0).astype(np.float64)
    return Q, K, V, dict(model=model, layer=p["layer"], spec=spec, causal=info["causal"], pre_or_post_rope=rope,
                         segments=meta.get("segments", [0]), text_hash=meta["text_hash"], file_hash=meta["file_hash"],
                         perplexity=meta.get("perplexity"), n_heads=info["n_heads"], n_kv_heads=info["n_kv_heads"])


def kv_heads(spec: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """The distinct key and value heads of a layer, float64 (H_kv, n, d): no GQA repetition (3 for SmolLM2)."""
    p = parse_spec(spec)
    Q, K, V, meta = layer_heads(spec)
    if p["model"] == "synthetic":
        return K, V, meta
    rep = MODEL_INFO[p["model"]]["n_heads"] // MODEL_INFO[p["model"]]["n_kv_heads"]
    return K[::rep], V[::rep], meta
