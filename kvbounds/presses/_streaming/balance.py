"""Merge-and-reduce over weighted coresets for a cache kept at a fixed size while tokens keep arriving
(BalanceKV-NeurIPS Alg. 1 / Alg. 4 MergeAndReduce with Alg. 2 SoftmaxBalance's walk; claims BKV.decode, BKV.attention).

Every token of the compressed middle carries a level l and weight 2^l (log-weight l log 2, the same on the
numerator and the denominator). Tokens leaving the exact recent window enter at level 0. To bring the middle back
to its size, :func:`halve_pairs` takes the oldest 2P tokens of the lowest level holding two or more, pairs them in
arrival order and runs the self-balancing walk (Alweiss-Liu-Sawhney; BalanceKV-NeurIPS Thm A.1, Alg. 2 lines 6-11)
on the pair differences d_p = u_a - u_b, u = phi(k) (x) [v / R_v, 1] (the Gram through the kernel identity
<phi(k), phi(k')> = e^{<k,k'>/sqrt d}); the sign keeps one token of each pair at twice the weight. The error that
step adds to the numerator and denominator sums is exactly 2^l sum_p s_p d_p, the walk's signed sum.

Where this differs from the paper: (1) pairs, not free signs: Alg. 2 keeps the smaller sign class, so |C'| <= |C|/2
and the weight mass of the level drifts; pairing keeps exactly half and the mass exactly (each kept token stands for
its pair); (2) the levels are not cells of a fixed size t: the cache has a fixed token budget, so a reduction halves
just as many pairs as the budget needs, lowest level first (Alg. 4 merges whole cells of size t); (3) one walk
balances [v, 1] at once, i.e. one token subset serves numerator and denominator (Alg. 1 runs separate instances), and
there are no value-norm buckets (Alg. 1 line 8); (4) weights are per row: a pair whose two tokens weigh differently
in a row (a padding token weighs 0; a token merged by :func:`merge_unequal` weighs the sum of two) is not walked in
that row: its first token is kept with probability w_a / (w_a + w_b), carrying both weights (:func:`merge_pair_rule`),
so every row keeps its mass (its visible tokens) exactly. The walk constant is the theorem's c = 30 log(P / delta)
times the largest ||d_p||^2 (the walk is stated for vectors of norm <= 1).

The walk's own sums (:class:`WalkSums`): the halving's error vector has norm 2^l ||sum_p s_p d_p|| =
2^l sqrt(s^T D s) e^{m_k / 2} in feature space (D the normalised Gram of the d's, m_k the largest ||k||^2 / sqrt d
of the group), so by Cauchy-Schwarz its numerator part at any query q is at most that times R_v e^{||q||^2 /
(2 sqrt d)} and its denominator part that times e^{||q||^2 / (2 sqrt d)}; summed over every halving of a head, in the
log domain.
"""
from __future__ import annotations

import math

import torch

LOG2 = math.log(2.0)


def pair_gram(K, V, alive, scale: float):
    """Normalised Gram of the pair differences. K (B, 2P, d), V (B, 2P, e), alive (B, 2P) bool -> D (B, P, P)
    float64 (entries <d_p, d_p'> / e^{m_k}, values divided by R_v), m_k (B,) = max ||k||^2 scale, R_v (B,) = max ||v||."""
    K, V = K.double(), V.double()
    Ks = K * math.sqrt(scale)
    nk2 = (Ks * Ks).sum(-1).masked_fill(~alive, -math.inf)
    mk = nk2.max(-1).values.clamp_min(0.0)                            # (B,)
    rv = (V * V).sum(-1).masked_fill(~alive, 0.0).max(-1).values.sqrt()  # (B,)
    Vs = V / torch.where(rv > 0, rv, torch.ones_like(rv))[:, None, None]
    E = torch.exp(Ks @ Ks.transpose(1, 2) - mk[:, None, None])
    G = E * (Vs @ Vs.transpose(1, 2) + 1.0)
    G = G * (alive[:, :, None] & alive[:, None, :])
    D = G[:, 0::2, 0::2] - G[:, 0::2, 1::2] - G[:, 1::2, 0::2] + G[:, 1::2, 1::2]
    return D, mk, rv


SIGNS = ("walk", "random")


def walk_signs(D, uniforms, delta: float = 0.01, rule: str = "walk"):
    """The self-balancing walk on vectors with Gram D (B, P, P): s_p = +1 with probability (1 - <w, d_p>/c)/2
    (clipped), w the signed sum so far; ``uniforms`` (B, P). ``rule="random"``: the ablation, s_p = +1 iff u_p < 1/2
    (fair coins on the same uniforms). Returns (signs (B, P) float64, s^T D s (B,))."""
    if rule not in SIGNS:
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"rule must be one of {SIGNS}, got {rule!r}")
    B, P, _ = D.shape
    if rule == "random":
        signs = torch.where(uniforms < 0.5, 1.0, -1.0).to(D.dtype)
        return signs, (signs[:, :, None] * D * signs[:, None, :]).sum((1, 2)).clamp_min(0.0)
    diag = torch.diagonal(D, dim1=1, dim2=2)
    c = 30.0 * math.log(max(P, 2) / delta) * diag.max(-1).values.clamp_min(1e-300)     # (B,)
    run = torch.zeros(B, P, dtype=D.dtype)          # <w, d_i> for every i
    signs = torch.empty(B, P, dtype=D.dtype)
    for i in range(P):
        p_plus = (0.5 - run[:, i] / (2 * c)).clamp(0.0, 1.0)
        s = torch.where(uniforms[:, i] < p_plus, 1.0, -1.0).to(D.dtype)
        signs[:, i] = s
        run += s[:, None] * D[:, i, :]
    disc2 = (signs[:, :, None] * D * signs[:, None, :]).sum((1, 2)).clamp_min(0.0)
    return signs, disc2


class WalkSums:
    """Per (layer, row, KV head) stream, in the log domain: log X_num = log sum_h 2^l_h e^{m_k,h/2}
    sqrt(s^T D s)_h R_v,h and log X_den the same without R_v, over every halving h (plus, for a pair of unequal
    weights merged by :func:`merge_pair_rule`, the dropped token's weight times ||d_p||). At a query q the numerator
    error is <= e^{log X_num + ||q||^2 scale / 2}, the denominator's <= e^{log X_den + ||q||^2 scale / 2}
    (Cauchy-Schwarz in feature space): kept as logs, so a large query gives a large log, never inf or NaN."""

    def __init__(self, shape):
        self.log_num = torch.full(shape, -math.inf, dtype=torch.float64)
        self.log_den = torch.full(shape, -math.inf, dtype=torch.float64)
        self.halvings = 0
        self.uncertified = 0           # merges of the two lowest-level tokens (merge_unequal)

    def add(self, log_term, rv) -> None:
        """``log_term`` (B,): the log of a step's error-vector norm in feature space (values divided by R_v);
        ``rv`` (B,) the R_v it was divided by."""
        shape = self.log_num.shape
        self.log_den = torch.logaddexp(self.log_den, log_term.reshape(shape))
        self.log_num = torch.logaddexp(self.log_num, (log_term + torch.log(rv)).reshape(shape))

    def copy(self) -> "WalkSums":
        c = WalkSums(self.log_num.shape)
        c.log_num, c.log_den = self.log_num.clone(), self.log_den.clone()
        c.halvings, c.uncertified = self.halvings, self.uncertified
        return c


def merge_pair_rule(la, lb, signs, u):
    """Which token of each pair is kept and its new log-weight, per row: pairs of equal live weights follow the
    walk's sign (``signs`` > 0 keeps the first) at twice the weight; pairs of unequal weights (a padding token has
    weight 0, a merged token any weight) keep the first with probability w_a / (w_a + w_b) (``u`` < that) carrying
    both weights; two padding tokens stay padding. Every rule keeps each row's mass w_a + w_b exactly.
    la, lb, signs, u (B, P) -> (keep_first (B, P) bool, new log-weight (B, P), equal (B, P) bool)."""
    equal = torch.isfinite(la) & (la == lb)
    p_first = torch.sigmoid((la - lb).double()).nan_to_num(1.0)       # both -inf: keep the first (weight -inf)
    keep_first = torch.where(equal, signs > 0, u < p_first)
    new = torch.where(equal, la + LOG2, torch.logaddexp(la, lb))
    return keep_first, new, equal


def halve_pairs(K, V, logw, levels: list, level: int, pairs: int, *, sink: int, scale: float, uniform, cert=None,
                signs: str = "walk"):
    """Halve ``pairs`` pairs of level ``level`` in a stack of layers' caches K, V (B, S, d), logw (B, S) (the
    middle starts at ``sink``; ``levels`` its per-token levels, the same for every row; ``uniform(P)`` -> (B, P)
    uniforms in [0, 1), each row from its own stream). Returns the new (K, V, logw, levels)."""
    pos = [i for i, l in enumerate(levels) if l == level][:2 * pairs]
    idx = torch.tensor([sink + i for i in pos])
    Kg, Vg, lg = K[:, idx], V[:, idx], logw[:, idx]
    la, lb = lg[:, 0::2], lg[:, 1::2]
    equal = (torch.isfinite(la) & (la == lb)).repeat_interleave(2, 1)
    D, mk, rv = pair_gram(Kg, Vg, equal, scale)
    u = uniform(pairs)
    signs, disc2 = walk_signs(D, u, rule=signs)             # the rule name in, the signs out
    keep_first, new_w, eq = merge_pair_rule(la, lb, signs, u)
    if cert is not None:
        term = level * LOG2 + mk / 2 + 0.5 * torch.log(disc2)                 # the walk's signed sum
        live = torch.isfinite(la) & torch.isfinite(lb) & ~eq                  # unequal live pairs: w_dropped ||d_p||
        if bool(live.any()):
            Dl, mkl, rvl = pair_gram(Kg, Vg, torch.isfinite(lg), scale)
            # the same R_v for both terms (the larger), so each stays a bound on its numerator part
            rv = torch.maximum(rv, rvl)
            dropped = torch.where(keep_first, lb, la).double()
            dn = torch.diagonal(Dl, dim1=1, dim2=2).clamp_min(0.0).sqrt()
            extra = torch.logsumexp(torch.where(live, dropped + torch.log(dn), -math.inf), -1) + mkl / 2
            term = torch.logaddexp(term, extra)
        cert.add(term, rv)
        cert.halvings += 1
    first = idx[0::2][None, :].expand(K.shape[0], pairs)
    second = idx[1::2][None, :].expand(K.shape[0], pairs)
    keep = torch.where(keep_first, first, second)                       # (B, P) stored positions kept
    B, S = logw.shape
    mask = torch.ones(S, dtype=torch.bool)
    mask[idx] = False
    others = torch.arange(S)[mask]
    # kept tokens take the slot of their pair's first token, so the middle stays in arrival order
    order = torch.cat([others, idx[0::2]]).argsort()
    gather = torch.cat([others[None, :].expand(B, -1), keep], 1)[:, order]       # (B, S - P)
    Kn = K.gather(1, gather[..., None].expand(-1, -1, K.shape[-1]))
    Vn = V.gather(1, gather[..., None].expand(-1, -1, V.shape[-1]))
    ln = torch.cat([logw[:, others], new_w.to(logw.dtype)], 1)[:, order]
    first_slots, in_pos = set(pos[0::2]), set(pos)
    new_levels = [l + (i in first_slots) for i, l in enumerate(levels) if not (i in in_pos and i not in first_slots)]
    return Kn, Vn, ln, new_levels


def merge_unequal(K, V, logw, levels: list, *, sink: int, uniform, cert=None):
    """The rare case where no level holds two tokens (the middle is no larger than its number of levels): the two
    lowest-level tokens are merged into one, kept with probability proportional to its weight, carrying both
    weights (unbiased; mass kept exactly). Returns (K, V, logw, levels)."""
    order = sorted(range(len(levels)), key=lambda i: levels[i])[:2]
    a, b = sink + order[0], sink + order[1]
    wa, wb = logw[:, a], logw[:, b]
    tot = torch.logaddexp(wa, wb)
    pa = torch.exp(wa - tot).nan_to_num(0.5)
    take_a = uniform(1)[:, 0].to(pa.dtype) < pa
    if cert is not None:
        cert.uncertified += 1
    K, V, logw = K.clone(), V.clone(), logw.clone()
    K[:, a] = torch.where(take_a[:, None], K[:, a], K[:, b])
    V[:, a] = torch.where(take_a[:, None], V[:, a], V[:, b])
    logw[:, a] = tot
    keep = [i for i in range(K.shape[1]) if i != b]
    levels = list(levels)
    levels[order[0]] = max(levels[order[0]], levels[order[1]]) + 1
    del levels[order[1]]
    return K[:, keep], V[:, keep], logw[:, keep], levels


def reduce_middle(K, V, logw, levels: list, budget: int, *, sink: int, scale: float, uniform, cert=None,
                  signs: str = "walk"):
    """Halve pairs, lowest level first, until the middle holds ``budget`` tokens (``signs``: :func:`walk_signs`'s
    rule)."""
    while len(levels) > budget:
        excess = len(levels) - budget
        counts: dict[int, int] = {}
        for l in levels:
            counts[l] = counts.get(l, 0) + 1
        full = [l for l in sorted(counts) if counts[l] >= 2]
        if not full:
            K, V, logw, levels = merge_unequal(K, V, logw, levels, sink=sink, uniform=uniform, cert=cert)
            continue
        lvl = full[0]
        K, V, logw, levels = halve_pairs(K, V, logw, levels, lvl, min(excess, counts[lvl] // 2), sink=sink,
                                         scale=scale, uniform=uniform, cert=cert, signs=signs)
    return K, V, logw, levels
