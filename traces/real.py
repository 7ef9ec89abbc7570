"""Real attention traces: per-layer, per-head queries, keys and values of two real models, offline.

Models (both shipped inside PyPI packages; nothing is downloaded):
  * ``smollm2``  SmolLM2-135M-Instruct, a Llama decoder with RoPE and grouped-query attention
                 (:mod:`kvbounds.traces.smollm2`): q (n, 9, 64), k/v (n, 3, 64); query head h reads KV head h // 3.
  * ``minilm``   all-MiniLM-L6-v2, a BERT encoder with absolute positions (:mod:`kvbounds.traces.minilm`): q/k/v (n, 12, 32).

Text: Python's own documentation topics (``pydoc_data.topics``, about 0.5 MB of English, stdlib, so
always offline), or any text file. The first n tokens are used: greedy, deterministic, no sampling.

Cache: ``cache_root()/traces/<model>-n<N>-t<text hash>/`` with one ``L<layer>.npz`` per extracted layer
(float32 arrays, names in the sidecar's layout), ``tokens.npy`` and the JSON sidecar ``meta.json``
(model, model file hash, text hash, token count, dtype, layout, per-layer verification, perplexity or
sentence-similarity sanity). A cached extraction is reused when the model file and text hashes match;
missing layers are added by one more forward pass. ``cache_root()`` is ``$KVBOUNDS_CACHE`` if set,
else ``$XDG_CACHE_HOME/kvbounds``, else ``~/.cache/kvbounds`` (outside the repository). Concurrent
processes (the runner's pool) serialise on a lock file, so an extraction runs once. SmolLM2's dequantized
model is kept beside them (``cache_root()/models/``, see :func:`kvbounds.traces.smollm2.load_hf`).

Verification (stored per layer in the sidecar, and raised as :class:`ExtractionError` if it fails):
attention recomputed in float64 from the captured post-RoPE q/k/v (causal for SmolLM2, within each
segment for MiniLM) must match the model's own attention output; SmolLM2's stored post-RoPE keys must
equal RoPE applied to the pre-RoPE keys; SmolLM2's perplexity on the text is recorded (about 12 on
the default text at 2048 tokens); MiniLM's sentence similarities must be sane.

Modules: :mod:`.real_cache` (models, text, cache), :mod:`.real_verify` (the verification above),
:mod:`.real_specs` (loading layers and heads, trace specs); this one runs the extraction and re-exports
every public name of the three.

Trace specs (what checks put in their params): ``"smollm2:L3:H0:1024"`` (post-RoPE, the default),
``"smollm2:L3:H0:1024:pre"``, ``"minilm:L2:H5:512"``; ``"synthetic:<kind>:<n>:<d>[:<seed>]"`` names a
:func:`kvbounds.traces.synthetic.make_trace` trace (the fallback when a model package is missing).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import single_blas_thread  # noqa: F401 - re-exported for the real-trace checks

from .smollm2 import ModelUnavailable
from .synthetic import Trace, make_trace  # noqa: F401 - re-exported
from .real_cache import (DEFAULT_TEXT, FORMAT_VERSION, MODEL_FORMAT, MODEL_INFO, MODELS, VERIFY_ROWS, VERIFY_TOL,  # noqa: F401
                         atomic_write, check_model, entry_dir, stat_hash, load_real_model, locked, model_module, available,
                         cache_root, default_text, file_hash, layout, model_info, read_text, text_hash)
from .real_verify import verify_rows, recompute_attention, rope_numpy, verify_layer  # noqa: F401


__all__ = ["MODELS", "ModelUnavailable", "ExtractionError", "Extraction", "available", "cache_root", "default_text",
           "extract", "load_layer", "load_trace", "trace_from_spec", "traces_from_spec", "parse_spec",
           "real_or_synthetic_spec", "clusterability_traces", "model_info"]


class ExtractionError(RuntimeError):
    """The captured q/k/v do not reproduce the model's own attention (or a sanity check failed)."""



@dataclasses.dataclass
class Extraction:
    """A cached extraction: ``meta`` is the sidecar; ``layer(l)`` reads one layer's float32 arrays."""
    path: Path
    meta: dict

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

    @property
    def layers(self) -> list[int]:
        return [int(l) for l in self.meta["layers"]]

    def layer(self, l: int) -> dict[str, np.ndarray]:
        if int(l) not in self.layers:
            raise InputError(f"layer {l} is not in this extraction (layers {self.layers})")
        with np.load(self.path / f"L{int(l):02d}.npz") as z:
            return {k: z[k] for k in z.files}

    def tokens(self) -> np.ndarray:
        return np.load(self.path / "tokens.npy")


def _parse_layers(layers, n_layers: int) -> list[int]:
    if layers is None or layers == "all":
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)):
        layers = [int(layers)]
    if isinstance(layers, str):
        out = []
        for part in layers.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-")
                out += list(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
        layers = out
    out = sorted({int(l) for l in layers})
    bad = [l for l in out if not 0 <= l < n_layers]
    if bad or not out:
        raise InputError(f"layers must be in [0, {n_layers}), got {layers!r}")
    return out


def extract(model: str, n_tokens: int, *, layers=None, text: str | os.PathLike | None = None,
            cache_dir: str | os.PathLike | None = None, force: bool = False, verify: bool = True) -> Extraction:
    """Extract (or reuse from the cache) ``layers`` (default all) of ``model`` on the first ``n_tokens``
    tokens of ``text`` (default: pydoc_data.topics). Raises :class:`ModelUnavailable` with the install
    command when the model package is missing, :class:`ExtractionError` when verification fails."""
    check_model(model)
    info = MODEL_INFO[model]
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, np.integer)) or n_tokens < 2:
        raise InputError(f"n_tokens must be an integer >= 2, got {n_tokens!r}")
    n_tokens = int(n_tokens)
    if model == "smollm2" and n_tokens > info["context"]:
        raise InputError(f"SmolLM2's context is {info['context']} tokens; got n_tokens = {n_tokens}")
    want = _parse_layers(layers, info["n_layers"])
    why = available(model)
    if why:
        raise ModelUnavailable(why)
    mfile = model_module(model).model_file()
    body, source = read_text(text)
    thash = text_hash(body)
    root = cache_root(cache_dir)
    entry = entry_dir(root, model, n_tokens, thash)
    with locked(entry.parent / (entry.name + ".lock")):
        meta = _read_meta(entry)
        fhash = file_hash(mfile)
        if meta is not None and (force or meta.get("file_hash") != fhash or meta.get("format") != MODEL_FORMAT[model]
                                 or meta.get("text_hash") != thash):
            meta = None
        have = set(meta["layers"]) if meta else set()
        missing = [l for l in want if l not in have]
        if missing:
            entry.mkdir(parents=True, exist_ok=True)
            meta = _run_extraction(model, n_tokens, missing, body, source, thash, fhash, mfile, entry, meta, verify)
        return Extraction(entry, meta)


def cached_extraction(model, n_tokens, text, cache_dir) -> Extraction | None:
    """The cached extraction if it exists and matches the installed model file and the text (no lock, no model load)."""
    try:
        body, _ = read_text(text)
        entry = entry_dir(cache_root(cache_dir), model, int(n_tokens), text_hash(body))
        meta = _read_meta(entry)
        if meta is None or meta.get("format") != MODEL_FORMAT[model] or meta.get("file_hash") != file_hash(model_module(model).model_file()):
            return None
        return Extraction(entry, meta)
    except (ModelUnavailable, OSError):
        return None


def _read_meta(entry: Path) -> dict | None:
    p = entry / "meta.json"
    if not p.exists():
        return None
    try:
        meta = json.loads(p.read_text())
    except json.JSONDecodeError:
        return None
    if not all((entry / f"L{int(l):02d}.npz").exists() for l in meta.get("layers", [])):
        return None
    return meta


@contextlib.contextmanager
def _torch_threads():
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _run_extraction(model, n, layers, body, source, thash, fhash, mfile, entry, meta, verify) -> dict:
    t0 = time.perf_counter()
    m = load_real_model(model)
    t_load = time.perf_counter() - t0
    ids = m.encode(body)
    caps: dict[int, dict] = {}
    extra: dict = {}
    t1 = time.perf_counter()
    with _torch_threads():
        if model == "smollm2":
            if len(ids) < n:
                raise InputError(f"the text has {len(ids)} tokens, fewer than n_tokens = {n}")
            tokens = ids[:n]
            logprobs, caps = m.forward(tokens, capture=layers)
            from .smollm2 import perplexity
            extra["perplexity"] = perplexity(logprobs)
            segments = [0]
        else:
            segs = m.segments(ids, n)
            parts = [m.forward(s, capture=layers)[1] for s in segs]
            caps = {l: {k: np.concatenate([p[l][k] for p in parts]) for k in parts[0][l]} for l in layers}
            tokens = np.concatenate(segs)
            segments = list(np.cumsum([0] + [len(s) for s in segs[:-1]]).tolist())
    t_fwd = time.perf_counter() - t1
    if model == "minilm":
        extra["similarity"] = _similarity(m)
    ver = {}
    t2 = time.perf_counter()
    with single_blas_thread():
        for l in layers:
            ver[str(l)] = verify_layer(model, caps[l], segments=segments)
    t_ver = time.perf_counter() - t2
    for l in layers:
        if verify and not ver[str(l)]["ok"]:
            raise ExtractionError(f"{model} layer {l}: captured q/k/v do not reproduce the model's attention: {ver[str(l)]}")
    if verify and model == "minilm" and not extra["similarity"]["sane"]:
        raise ExtractionError(f"MiniLM sentence similarities are not sane: {extra['similarity']}")
    for l in layers:
        arrays = {k: v.astype(np.float32) for k, v in caps[l].items() if k != "attn"}
        atomic_write(entry / f"L{l:02d}.npz", lambda tmp, a=arrays: _save(tmp, np.savez, **a))
    atomic_write(entry / "tokens.npy", lambda tmp: _save(tmp, np.save, np.asarray(tokens, np.int64)))
    old_layers = list(meta["layers"]) if meta else []
    new = {
        "format": MODEL_FORMAT[model], "model": model, "model_file": str(mfile), "file_hash": fhash,
        "text_source": source, "text_hash": thash, "text_chars": len(body), "n_tokens": n,
        "tokens_hash": hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).hexdigest(),
        "dtype": "float32", "layers": sorted(set(old_layers) | set(layers)), "layout": layout(model),
        "segments": segments, "model_info": MODEL_INFO[model],
        "verification": {**(meta.get("verification", {}) if meta else {}), **ver},
        "verify_tol": VERIFY_TOL,
        "timing": {**(meta.get("timing", {}) if meta else {}),
                   "last": {"layers": layers, "load_s": t_load, "forward_s": t_fwd, "verify_s": t_ver,
                            "total_s": time.perf_counter() - t0}},
        **{k: (meta or {}).get(k) for k in ("perplexity", "similarity") if (meta or {}).get(k) is not None},
        **extra,
    }
    atomic_write(entry / "meta.json", lambda tmp: Path(tmp).write_text(json.dumps(new, indent=1) + "\n"))
    return new


def _save(path, fn, *args, **kw) -> None:
    with open(path, "wb") as fh:
        fn(fh, *args, **kw)


def _similarity(m) -> dict:
    from .minilm import similarity_check
    return similarity_check(m)


# loading and trace specs (kvbounds.traces.real_specs), importable from here as before
from .real_specs import (head_arrays, clusterability_traces, kv_heads, layer_heads, load_layer,  # noqa: E402,F401
                         load_trace, parse_spec, real_or_synthetic_spec, trace_from_spec, traces_from_spec)
