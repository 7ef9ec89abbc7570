"""The baseline of bench_balancekv (CPU) and bench_gpu (any device): the authors' released BalanceKV walk
(github.com/ksheth96/BalanceKV, src/balanced_walk.py at commit 4ccee30a, ``balanced_walk`` with a value and no
query; defaults as in run_longbench.py: gamma = 4, temp = 1, beta = 0), re-implemented in torch with the same
operations and costs. One copy: the benchmarks measure our walk against this."""
from __future__ import annotations

import math

import torch


def released_balanced_walk(key, value, generator, *, gamma=4.0, itrs=2, block_size=256, temp=1.0, beta=0.0):
    """The released ``balanced_walk`` (BalanceKV repository, src/balanced_walk.py, no query, value given),
    re-implemented with the same operations and costs: per level, keys (and weighted values) gathered
    and zero-padded into blocks, keys centred per block, the full (b x b) kernel
    exp(temp <k, k'>/sqrt d - beta) * (<v, v'> + 1e-8 + 0.025) materialized, int16 signs with the first
    fixed to +1, then for i = 1..b-1 one reduction over the whole kernel row (kernel[i, :] * signs) and
    p = 1/2 - gamma * that; halving: cut where either sign reaches n/2 (cumsum), +-2 weights before the
    cut (flipped if the sign there is +1), 1 after, stable argsort. Returns (sort_idx, weights)."""
    B, H, n, d = key.shape
    sort_idx = weights = None
    for _ in range(itrs):
        n_pad = math.ceil(n / block_size) * block_size
        if sort_idx is None:
            ks, vs = key, value
        else:
            ix = sort_idx[..., None].expand(-1, -1, -1, d)
            ks, vs = key.gather(2, ix), value.gather(2, ix) * weights[..., None].to(value.dtype)
        ks = torch.nn.functional.pad(ks, (0, 0, 0, n_pad - ks.shape[2])).view(B, H, -1, block_size, d)
        vs = torch.nn.functional.pad(vs, (0, 0, 0, n_pad - vs.shape[2])).view(B, H, -1, block_size, d)
        kc = ks - ks.mean(dim=-2, keepdim=True)
        kern = torch.exp(temp * torch.einsum("...nd,...sd->...ns", kc, kc) / math.sqrt(d) - beta)
        kern *= 1e-8 + torch.einsum("...nd,...sd->...ns", vs, vs) + 0.025
        signs = torch.zeros(kern.shape[:4], dtype=torch.int16, device=key.device)
        signs[..., 0] = 1
        u = torch.rand(signs.shape, generator=generator, device=key.device)
        for i in range(1, block_size):
            inner = (kern[..., i, :] * signs).sum(dim=-1)
            signs[..., i] = 2 * (u[..., i] < 0.5 - gamma * inner) - 1
        signs = signs.view(B, H, -1)[..., :n]
        half = n // 2
        cut = torch.maximum(torch.argmax(((signs == -1).cumsum(-1) == half).to(torch.int64), dim=-1),
                            torch.argmax(((signs == 1).cumsum(-1) == half).to(torch.int64), dim=-1))
        pos = torch.arange(n, device=key.device).view(1, 1, -1)
        before = pos <= cut[..., None]
        flip = (signs.gather(2, cut[..., None]) == 1)
        w = torch.where(before, 2 * signs * torch.where(flip, -1, 1), torch.ones_like(signs))
        order = torch.argsort(-w, dim=-1, stable=True)[..., :half]
        sort_idx = order if sort_idx is None else sort_idx.gather(2, order)
        wk = w.gather(-1, order)
        weights = wk if weights is None else weights.gather(-1, order) * wk
        n = half
    return sort_idx, weights
