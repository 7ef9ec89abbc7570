"""H2O in the end-to-end harness: heavy hitters by accumulated attention over the prompt, plus recent tokens.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models"
(arXiv:2306.14048), Sec. 3-4: the cache keeps the tokens with the largest accumulated attention ("heavy hitters")
and the most recent ones, half the budget each. On a prompt that is compressed once after its prefill (the
harness's setting, and what the authors' ``h2o_hf`` code does for the prompt), a key's accumulated score is
the sum over every prompt query (and, with grouped-query attention, over the query heads sharing the KV head)
of its causal softmax weight. Weights 1 (a selection, :func:`kvbounds.algorithms.token_selection.gather_selection`).
Claims: BKV.e2e, SG.e2e (a baseline; SG.e2e's papers compare with H2O, SubGen Table 1 / ClusterGen Table 2).

The scores (:func:`received_attention`) are collected during the exact prefill when it is asked to
(``harness.prefill(..., received=True)``: the queries are already there, so H2O's compression is only
its top-k); without them :func:`accumulated_attention` recomputes the queries from the captured inputs. Both give
the same scores (the same function of the same rotated queries and keys).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.validation import InputError

BLOCK = 48     # query tokens per block of received_attention (measured at n = 512 and 2048, 1 thread; issue 26)


def received_attention(query, key, scale: float | None = None, *, prefixes=()) -> dict:
    """Causal attention each key received, summed over the queries and the query heads of its KV group.

    ``query`` (1, H, n, d) rotated queries, ``key`` (1, Hkv, n, d) keys of the same n tokens (an exact causal
    prefill), ``scale`` (default 1/sqrt(d)). Returns {m: (Hkv, n) float32} for m = n and every m in ``prefixes``
    (0 < m < n): the sums over the first m queries only (the scores of the prompt's first m tokens alone, a
    causal model's prefix; keys >= m get 0). Queries in blocks of tokens, each block's softmax over the keys it
    sees (the causal lower triangle only).

    Layout: the scaled queries of a KV group's heads are interleaved token by token, (Hkv, n, group,
    d), so a block of tokens is one contiguous (tokens x group, d) matrix per KV head: one batched product with
    the keys (their transpose a view), no broadcast copy of the keys per block, and the column sums one reduction
    over the block's rows (:data:`BLOCK` tokens per block)."""
    import torch
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)) or query.ndim != 4 or key.ndim != 4:
        raise InputError("query and key must be torch tensors (1, heads, tokens, head_dim)")
    _, H, n, d = query.shape
    Hkv = key.shape[1]
    if query.shape[0] != 1 or key.shape[0] != 1 or tuple(key.shape[2:]) != (n, d) or H % Hkv:
        raise InputError(f"query {tuple(query.shape)} and key {tuple(key.shape)} must be one sequence's (1, H, n, d) "
                         "and (1, Hkv, n, d), H a multiple of Hkv")
    cuts = sorted({int(m) for m in prefixes if 0 < int(m) < n} | {n})
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    g = H // Hkv
    q = (query[0].float() * scale).reshape(Hkv, g, n, d).transpose(1, 2).contiguous()     # (Hkv, n, g, d)
    k = key[0].float()
    block = BLOCK
    acc = torch.zeros(Hkv, n, dtype=torch.float32, device=query.device)
    upper = torch.ones(block, block, dtype=torch.bool, device=query.device).triu(1)[:, None, :]   # (token, 1, key)
    out = {}
    for i0 in range(0, n, block):
        i1 = min(n, i0 + block)
        b = i1 - i0
        lg = torch.matmul(q[:, i0:i1].reshape(Hkv, b * g, d), k[:, :i1].transpose(1, 2))   # (Hkv, b g, keys <= i1)
        lg.view(Hkv, b, g, i1)[..., i0:i1].masked_fill_(upper[:b, :, :b], -math.inf)
        w = torch.softmax(lg, -1)
        for m in cuts[:-1]:              # a prefix ending in this block: its rows only (the blocks stay the same)
            if i0 < m <= i1:
                out[m] = acc.clone()
                out[m][:, :i1] += w[:, :(m - i0) * g].sum(1)
        acc[:, :i1] += w.sum(1)
    out[n] = acc
    return out


def accumulated_attention(module, attn_kwargs: dict, keys) -> "torch.Tensor":   # noqa: F821
    """(Hkv, n) float32: per KV head, the causal attention each prompt key received, summed over the queries
    (the queries recomputed from the layer's captured inputs and rotary embedding, Llama-family attention;
    :func:`received_attention`)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    h = attn_kwargs["hidden_states"]
    cos, sin = attn_kwargs["position_embeddings"]
    n, d = h.shape[1], keys.shape[-1]
    q = module.q_proj(h).view(1, n, -1, d).transpose(1, 2)
    q, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return received_attention(q, keys, getattr(module, "scaling", None))[n]


def h2o_compress(lm, state, budget: float, *, window: int, where: str = "host") -> list[ts.CompressedKV]:
    """Every layer of the prefill ``state`` compressed by H2O to ``floor(budget n)`` tokens per KV head:
    the most recent max(window, half) tokens and the heaviest hitters among the rest. The scores are the
    prefill's own (``state.received``) when it collected them, else recomputed from its captured inputs."""
    import torch
    n = state.n
    tokens = int(math.floor(budget * n * 2 * state.keys[0].shape[-1])) // (2 * state.keys[0].shape[-1])
    if tokens <= window:
        raise InputError(f"budget {budget:g} ({tokens} tokens) does not exceed H2O's recent window ({window})")
    recent = min(max(window, tokens // 2), tokens - 1)
    received = getattr(state, "received", None)
    out = []
    with torch.no_grad():
        for l, layer in enumerate(lm.model.model.layers):
            score = (received[l] if received is not None else
                     accumulated_attention(layer.self_attn, state.attn_kwargs[l], state.keys[l]))[:, :n - recent]
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


def h2o_prefill(method: str, lm, state, budget: float, *, seed: int, sink: int, window: int,
                where: str = "host") -> list[ts.CompressedKV]:
    """The method registry's prefill form of H2O (:func:`h2o_compress` on the path
    :func:`kvbounds.e2e._methods.runs_on` gives ``where``)."""
    from ._methods import runs_on
    return h2o_compress(lm, state, budget, window=window, where=runs_on(method, where))
