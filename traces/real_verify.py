"""Real traces, part two (see :mod:`kvbounds.traces.real`): the verification of an extraction, attention
recomputed in float64 from the captured q/k/v against the model's own output, and RoPE re-applied to the
pre-RoPE keys."""
from __future__ import annotations

import math

import numpy as np

from .real_cache import MODEL_INFO, VERIFY_ROWS, VERIFY_TOL

__all__ = ["verify_rows", "rope_numpy", "recompute_attention", "verify_layer"]


def verify_rows(n: int, k: int) -> np.ndarray:
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
    idx = verify_rows(q.shape[0], rows)
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
