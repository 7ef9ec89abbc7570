"""H2O in the end-to-end harness: heavy hitters by accumulated attention over the prompt, plus recent tokens.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models"
(arXiv:2306.14048), Sec. 3-4: the cache keeps the tokens with the largest accumulated attention ("heavy hitters")
and the most recent ones, half the budget each. On a prompt that is compressed once after its prefill (the
harness's setting, and what the authors' ``h2o_hf`` code does for the prompt), a key's accumulated score is
the sum over every prompt query (and, with grouped-query attention, over the query heads sharing the KV head)
of its causal softmax weight. Weights 1 (a selection, :func:`kvbounds.algorithms.token_selection.gather_selection`).
Claims: BKV.e2e, SG.e2e (a baseline; SG.e2e's papers compare with H2O, SubGen Table 1 / ClusterGen Table 2).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.validation import InputError


def accumulated_attention(module, attn_kwargs: dict, keys) -> "torch.Tensor":   # noqa: F821
    """(Hkv, n) float32: per KV head, the causal attention each prompt key received, summed over the queries
    (recomputed from the layer's captured inputs and rotary embedding, Llama-family attention)."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    h = attn_kwargs["hidden_states"]
    cos, sin = attn_kwargs["position_embeddings"]
    n, d = h.shape[1], keys.shape[-1]
    q = module.q_proj(h).view(1, n, -1, d).transpose(1, 2)
    q, _ = apply_rotary_pos_emb(q, q, cos, sin)
    hkv = keys.shape[1]
    group = q.shape[1] // hkv
    q = q[0].float().reshape(hkv, group, n, d)
    k = keys[0].float()
    logits = torch.einsum("hgqd,hkd->hgqk", q, k) / math.sqrt(d)
    mask = torch.ones(n, n, dtype=torch.bool, device=k.device).triu(1)
    w = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
    return w.sum(dim=(1, 2))


def h2o_compress(lm, state, budget: float, *, window: int, where: str = "host") -> list[ts.CompressedKV]:
    """Every layer of the prefill ``state`` compressed by H2O to ``floor(budget n)`` tokens per KV head:
    the most recent max(window, half) tokens and the heaviest hitters among the rest."""
    import torch
    n = state.n
    tokens = int(math.floor(budget * n * 2 * state.keys[0].shape[-1])) // (2 * state.keys[0].shape[-1])
    if tokens <= window:
        raise InputError(f"budget {budget:g} ({tokens} tokens) does not exceed H2O's recent window ({window})")
    recent = min(max(window, tokens // 2), tokens - 1)
    out = []
    with torch.no_grad():
        for l, layer in enumerate(lm.model.model.layers):
            score = accumulated_attention(layer.self_attn, state.attn_kwargs[l], state.keys[l])[:, :n - recent]
            heavy = torch.topk(score, tokens - recent, dim=-1).indices
            tail = torch.arange(n - recent, n, device=heavy.device).expand(heavy.shape[0], recent)
            idx = torch.sort(torch.cat([heavy, tail], dim=-1), dim=-1).values
            K, V = state.keys[l][0].float(), state.values[l][0].float()
            if where == "host":
                K, V, idx = K.cpu().numpy(), V.cpu().numpy(), idx.cpu().numpy()
                out.append(ts.gather_selection(K, V, idx, np.zeros(idx.shape, np.float32)))
            else:
                out.append(ts.gather_selection(K, V, idx, torch.zeros(idx.shape, device=idx.device)))
    return out
