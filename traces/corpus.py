"""Distinct real texts, offline: the units of replication of the real-key streams.

A real-key stream is a window of one text; streams from one text are one unit, so a family needs as many distinct
texts as units. Both sources ship with Python (stdlib, always offline, the same on every machine with the same
Python version):

  * ``topic:<key>``    a topic of Python's documentation (``pydoc_data.topics``; each topic a distinct text);
  * ``module:<name>``  a stdlib module's documentation: its docstring, then each public member defined in it with
                       its docstring, in name order (pure-Python, platform-independent modules only: :data:`MODULES`).

:func:`texts` lists them in a fixed order (topics by key, then :data:`MODULES` in order), those of at least
``min_chars`` characters; :func:`text` reads one by name. A stream records the text's name and its sha256, so each
unit says where it came from. The real-trace cache (:mod:`kvbounds.traces.real`) reads a text by its name:
``extract(model, n, text="corpus:topic:specialnames")``.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import io
import warnings

from kvbounds.algorithms.validation import InputError

__all__ = ["PREFIX", "MODULES", "text", "texts", "text_sha256", "long_enough", "layer_heads"]

PREFIX = "corpus:"
# pure-Python stdlib modules whose documentation is long and the same on every platform (Python 3.11)
MODULES = ("typing", "doctest", "inspect", "ast", "uuid", "statistics", "difflib", "logging", "pdb", "argparse",
           "shutil", "socketserver", "re", "configparser", "json", "optparse", "subprocess", "pickletools",
           "traceback", "pkgutil", "random", "base64", "wave", "fileinput", "aifc", "smtplib", "ipaddress",
           "tempfile", "pydoc", "sunau", "collections", "ftplib", "imaplib", "textwrap", "threading", "shelve",
           "contextlib", "tarfile", "tokenize", "enum", "dataclasses", "zipfile", "timeit", "csv", "mimetypes",
           "cmd", "plistlib", "profile", "bdb", "pstats", "pyclbr", "getopt", "functools", "calendar", "gettext",
           "heapq", "copy", "string", "fractions", "glob", "fnmatch", "bisect", "queue", "sched", "weakref")


def _module_text(name: str) -> str:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        mod = importlib.import_module(name)
    parts = [inspect.cleandoc(mod.__doc__ or "")]
    for member in sorted(vars(mod)):
        obj = getattr(mod, member)
        if member.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        doc = inspect.getdoc(obj)
        if doc:
            parts.append(f"{member}\n{doc}")
    return "\n\n".join(p for p in parts if p)


@functools.lru_cache(maxsize=None)
def text(name: str) -> str:
    """The text named ``name`` ("topic:<key>" or "module:<name>", with or without the "corpus:" prefix)."""
    if not isinstance(name, str):
        raise InputError(f"a corpus text's name must be a string, got {name!r}")
    kind, _, key = name.removeprefix(PREFIX).partition(":")
    if kind == "topic":
        from pydoc_data.topics import topics
        if key in topics:
            return topics[key]
    elif kind == "module" and key in MODULES:
        return _module_text(key)
    raise InputError(f"no corpus text {name!r}: 'topic:<a pydoc_data.topics key>' or 'module:<one of MODULES>'")


@functools.lru_cache(maxsize=None)
def texts(min_chars: int = 0) -> tuple[str, ...]:
    """The names of the distinct texts of at least ``min_chars`` characters, in the corpus's fixed order."""
    from pydoc_data.topics import topics
    names = [f"topic:{k}" for k in sorted(topics)] + [f"module:{m}" for m in MODULES]
    return tuple(n for n in names if len(text(n)) >= min_chars)


def text_sha256(name: str) -> str:
    return hashlib.sha256(text(name).encode("utf-8")).hexdigest()


def _encoder(model: str):
    """The model's tokenizer as text -> ids (no special tokens), without loading the model's weights."""
    if model == "smollm2":
        from .smollm2 import load_tokenizer
        tok = load_tokenizer()
        return lambda t: tok.encode(t, add_special_tokens=False).ids
    if model == "minilm":
        import tokenizers
        from .minilm import model_dir
        tok = tokenizers.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        tok.no_truncation()
        return lambda t: tok.encode(t, add_special_tokens=False).ids
    raise InputError(f"model must be 'smollm2' or 'minilm', got {model!r}")


@functools.lru_cache(maxsize=None)
def long_enough(model: str, tokens: int) -> tuple[str, ...]:
    """The corpus's texts (:func:`texts`, in its order) with at least ``tokens`` tokens under ``model``'s tokenizer:
    a window of ``tokens`` tokens of each is a distinct unit. Needs the model's package (its tokenizer)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise InputError(f"tokens must be an integer >= 1, got {tokens!r}")
    encode = _encoder(model)
    return tuple(n for n in texts(min_chars=tokens) if len(encode(text(n))) >= tokens)


def layer_heads(model: str, layer: int, window: int, name: str, layers=()) -> tuple:
    """Every query head of one layer of ``model`` on the first ``window`` tokens of the corpus text ``name``, as
    float64 (H, window, d) arrays Q, K, V (K and V repeated per query head under grouped-query attention, so head h
    of K is KV head h // 3 for SmolLM2), and the meta (model, layer, text, its sha256, causal, heads), extracting
    ``layers`` (and ``layer``) together into the real-trace cache when missing (one forward pass)."""
    import numpy as np
    from .real import MODEL_INFO, head_arrays, load_layer
    arrays, meta = load_layer(model, int(layer), int(window), text=PREFIX + name,
                              prefetch=sorted({int(l) for l in layers} | {int(layer)}))
    info = MODEL_INFO[model]
    rope = "post" if model == "smollm2" else "none"
    heads = [head_arrays(model, arrays, h, rope)[:3] for h in range(info["n_heads"])]
    Q, K, V = (np.stack([np.asarray(h[i], np.float64) for h in heads]) for i in range(3))
    return Q, K, V, dict(model=model, layer=int(layer), text=name, text_hash=meta["text_hash"], causal=info["causal"],
                         n_heads=info["n_heads"], n_kv_heads=info["n_kv_heads"], segments=meta.get("segments", [0]))
