"""How much the self-balancing walk has to balance, measured on the blocks of tokens it sees.

BalanceKV-NeurIPS Alg. 2 (SoftmaxBalance) runs the self-balancing walk of Alweiss, Liu and Sawhney (BalanceKV-NeurIPS
Alg. 3, Thm A.1) on the vectors u_i = phi(k_i) (x) w_i, whose Gram is the exp kernel

    G_ij = e^{temp <k_i, k_j> scale - beta} (<v_i, v_j> + const)

(the pseudocode: temp 1, beta 0, scale 1/sqrt d, const 1 for the blockwise walk's w = [v, 1] and the streaming
press, const 0 for Alg. 1's numerator, v = 0 and const 1 for its denominator; the authors' released walk: temp 1 or
0.1, const 0.025 + 1e-8, each block's keys centred, k - mean of the block). The walk draws eta_i = +1 iff
u_i < p_i, u_i uniform, with p_i = 1/2 - x_i / (2 c R^2), x_i = sum_{j<i} eta_j G_ij, c = 30 log(n / delta) and R^2
Alg. 2's normalisation; the released code uses p_i = 1/2 - gamma x_i (gamma = 4, no normalisation) and eta_0 = +1.
Its aim is a small discrepancy ||sum_i eta_i u_i||^2 = eta^T G eta; independent random signs have
E[eta^T G eta] = tr G, whatever G.

The numbers, per block (:func:`walk_diagnostics` from a Gram, :func:`block_diagnostics` from keys and values; numpy
float64 on the host, any backend in):

* ``offdiag_share``  sum_{i != j} |G_ij| / sum_{i, j} |G_ij|: 0 for a diagonal Gram, where every signing has
  eta^T G eta = tr G and there is nothing to balance; (n - 1) / n for n equal vectors;
* ``cosine_offdiag_share``, ``max_coherence``  the same share, and the largest |C_ij| over i != j, for the cosine
  Gram C_ij = G_ij / sqrt(G_ii G_jj) (a token of large norm cannot hide the others). For the key factor of the exp
  kernel C_ij = e^{-temp scale ||k_i - k_j||^2 / 2}: pairs far apart in scale * ||k_i - k_j||^2 are orthogonal;
* per sign rule, every rule drawn from the same uniforms: ``theorem`` (the walk at the theorem's c), ``released``
  (gamma, first sign +1), ``greedy`` (eta_i = -sign x_i, the coin where x_i = 0: the c -> 0 limit of the walk, the
  sign that lowers the running discrepancy most), ``random`` (p = 1/2):
  ``<rule>_equal_random`` the share of steps 1..n-1 whose sign equals the random rule's (step 0 has x = 0 for every
  rule; the released code fixes it): 1 means the rule's probabilities moved no sign;
  ``<rule>_disc_ratio`` eta^T G eta / tr G, the discrepancy against independent random signs' expectation
  (below 1: the rule balances; the random rule's own value shows the spread of one draw);
* given held-out queries (:func:`block_diagnostics`'s ``Q``), ``<rule>_query_num`` / ``<rule>_query_den``: the
  rule's signs as those queries see them through the model's kernel, against random signs' exact expectation
  (:mod:`kvbounds.algorithms.query_discrepancy`; below 1: the rule balances what the attention error is made of);
* ``theorem_mean_abs_p_dev``  mean |p_i - 1/2| of the theorem walk;
* ``key_energy``, ``key_distance`` (:func:`key_geometry`)  the block's median temp scale ||k||^2 and median over pairs
  of temp scale ||k_i - k_j||^2 / 2.

Helpers: :func:`first_level_blocks` (the blocks blockwise BalanceKV's first level walks), :func:`summarize_diagnostics`
(median / min / max over blocks, for records); :mod:`kvbounds.battery.walk_probe` records the walks of a running stream.

Centring the keys by their block mean mu multiplies G_ij by lambda_i lambda_j e^{temp scale ||mu||^2}, lambda_i =
e^{-temp scale <k_i, mu>}: it reweights the same vectors and leaves the cosine Gram unchanged (a test checks it);
only the norms the walk sees, hence R^2 and its decisions, change.

Measured (benchmarks/walk_cause.py and BKV.vs-uniform's records, on the streams and layers of the BalanceKV checks):
the theorem's c = 30 log(n / delta) keeps |p - 1/2| below about 0.005 and 97-100% of the walk's signs equal the random
rule's wherever it was measured: the constant makes the walk a coin. The Gram yardstick eta^T G eta / tr G cannot say
what else a walk could do on real keys: on SmolLM2 past its first layer, at the model's temperature, the pairwise
distances temp scale ||k_i - k_j||^2 / 2 are about 7-15 in the median block, the off-diagonal share 1e-6 to 4e-2, and
even greedy keeps 0.97-1 of random signs' eta^T G eta, because the diagonal (the self-similarities) dominates it. What
held-out queries see of the same signs (``Q``: :mod:`kvbounds.algorithms.query_discrepancy`) does move: on
BKV.vs-uniform's blocks (layers 1 and 5, b = 128) greedy reaches 0.46-0.69 of random signs' discrepancy in the
numerator (0.46-0.61 with centring, which helps a walk that balances), and the released walk at temp 1 0.44-0.61
with centring, while the yardstick reads 1.00 for both.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from kvbounds.algorithms.arrays import to_numpy

from .blockwise_balance_kv import MAX_BLOCK
from .query_discrepancy import query_discrepancy
from .self_balancing_walk import walk_constant
from .validation import (InputError, check_array, check_int, check_probability, check_real, check_rng, check_scale,
                         namespace)

__all__ = ["RULES", "RELEASED_CONST", "KERNELS", "SYMMETRY_TOL", "COSINE_TOL", "LOG_CLIP", "KernelGram", "centred",
           "exp_kernel_gram", "rule_signs", "walk_diagnostics", "block_diagnostics", "key_geometry",
           "first_level_blocks", "blockwise_walk_cause", "centring_comparison", "summarize", "QUERY_KEYS",
           "SUMMARY_KEYS", "summarize_diagnostics"]

RULES = ("theorem", "released", "greedy", "random")
RELEASED_CONST = 0.025 + 1e-8        # the released kernel's kernel_const + 1e-8 (balance_kv_released)
# the kernels of the blockwise walks (names as the BalanceKV checks' variants): the pseudocode's w = [v, 1] at the
# model's temperature (App. B, compress_cache's value+1 kernel), the released walk at run_longbench.py's temp 1 and at
# the Fig. 1/3 notebook's temp 0.1 (gamma 4; its centring is the "centred" side of every comparison)
KERNELS = {"balance": dict(temp=1.0, const=1.0, gamma=None),
           "released-t1": dict(temp=1.0, const=RELEASED_CONST, gamma=4.0),
           "released-t0.1": dict(temp=0.1, const=RELEASED_CONST, gamma=4.0)}
SYMMETRY_TOL = 1e-9                  # |G - G^T| and a negative diagonal allowed, relative to max |G| (rounding)
COSINE_TOL = 1e-6                    # |C_ij| - 1 allowed (a float32 Gram's rounding: a few d eps_32 ~ 1e-7)
LOG_CLIP = 50.0                      # |p - 1/2| beyond e^50 decides the sign exactly as any larger value


@dataclasses.dataclass
class KernelGram:
    """The exp kernel of a block, G = e^{log_scale} gram, and Alg. 2's R^2 in gram's units (all numpy float64)."""
    gram: np.ndarray          # (..., n, n), e^{temp scale max ||k||^2 - beta} divided out: |entries| <= r2
    log_scale: np.ndarray     # (...,)
    r2: np.ndarray            # (...,) e^{temp scale max ||k||^2 - beta} max_i (||v_i||^2 + const) / e^{log_scale}


def _check_kv(K, V):
    check_array(K, "K", ndim=tuple(range(2, 9)), min_rows=1)
    check_array(V, "V", ndim=K.ndim, min_rows=1)
    namespace(K, V, names="K and V")
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    return np.asarray(to_numpy(K), dtype=np.float64), np.asarray(to_numpy(V), dtype=np.float64)


def _check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def centred(K):
    """Keys minus their block's mean (the released code's centring), over the token axis -2; numpy float64."""
    check_array(K, "K", ndim=tuple(range(2, 9)), min_rows=1)
    Kn = np.asarray(to_numpy(K), dtype=np.float64)
    return Kn - Kn.mean(axis=-2, keepdims=True)


def exp_kernel_gram(K, V, *, scale: float | None = None, temp: float = 1.0, const: float = 1.0, beta: float = 0.0,
                    centre: bool = False) -> KernelGram:
    """The Gram e^{temp <k_i, k_j> scale - beta} (<v_i, v_j> + const) of each block of K (..., n, d), V (..., n, s),
    with the block's keys centred first when ``centre``. Computed as e^{a_ij - max_l a_ll} (<v_i, v_j> + const),
    a_ij = temp scale <k_i, k_j>: the exponent is <= 0 (|a_ij| <= (a_ii + a_jj) / 2), so no key norm overflows it."""
    Kn, Vn = _check_kv(K, V)
    scale = check_scale(scale, Kn.shape[-1])
    temp = check_real(temp, "temp", minimum=0.0)
    const = check_real(const, "const", minimum=0.0)
    beta = check_real(beta, "beta")
    if _check_flag(centre, "centre"):
        Kn = Kn - Kn.mean(axis=-2, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        Ks = Kn * math.sqrt(temp * scale)          # keys pre-scaled: no product of huge keys before the scale
        a_diag = np.einsum("...nd,...nd->...n", Ks, Ks)
        w_diag = np.einsum("...ns,...ns->...n", Vn, Vn) + const
    if not (np.all(np.isfinite(a_diag)) and np.all(np.isfinite(w_diag))):
        raise InputError("K or V too large: temp * scale * ||k||^2 or ||v||^2 overflows float64")
    m = a_diag.max(axis=-1)
    # the exponent a_ij - m is <= 0 up to a rounding of ~ (d + 2) eps m; past ~80 that alone could overflow exp
    if float(m.max()) * (Kn.shape[-1] + 2) * np.finfo(np.float64).eps > 80.0:
        raise InputError(f"keys too large for the kernel's exponent: temp * scale * max||k||^2 = {float(m.max()):.3g}")
    G = np.exp(np.matmul(Ks, np.swapaxes(Ks, -1, -2)) - m[..., None, None])
    G *= np.matmul(Vn, np.swapaxes(Vn, -1, -2)) + const
    return KernelGram(G, m - beta, w_diag.max(axis=-1))


def _check_gram(G, uniforms):
    check_array(G, "G", ndim=tuple(range(2, 9)), min_rows=1)
    check_array(uniforms, "uniforms", ndim=G.ndim - 1)
    namespace(G, uniforms, names="G and uniforms")
    if G.shape[-1] != G.shape[-2] or tuple(uniforms.shape) != tuple(G.shape[:-1]):
        raise InputError(f"G must be (..., n, n) and uniforms (..., n), got {tuple(G.shape)} and "
                         f"{tuple(uniforms.shape)}")
    Gn = np.asarray(to_numpy(G), dtype=np.float64)
    U = np.asarray(to_numpy(uniforms), dtype=np.float64)
    if np.any(U < 0) or np.any(U >= 1):
        raise InputError("uniforms must lie in [0, 1)")
    top = np.abs(Gn).max(axis=(-1, -2), keepdims=True)
    if np.any(np.abs(Gn - np.swapaxes(Gn, -1, -2)) > SYMMETRY_TOL * top):
        raise InputError("G must be symmetric (a Gram matrix)")
    if np.any(np.diagonal(Gn, axis1=-2, axis2=-1) < -SYMMETRY_TOL * top[..., 0]):
        raise InputError("G must have a non-negative diagonal (a Gram matrix: G_ii = ||u_i||^2)")
    with np.errstate(over="ignore"):
        if not np.isfinite(np.abs(Gn).sum()):
            raise InputError("G too large: the sum of its entries overflows float64 (the walk's sums would)")
    return Gn, U


def _per_block(x, lead, name, *, minimum=None):
    """None, a real number, or a finite array of shape ``lead`` (entries >= minimum), as float64 of shape lead."""
    if x is None:
        return None
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)):
        return np.full(lead, check_real(x, name, minimum=minimum))
    if not hasattr(x, "shape"):
        raise InputError(f"{name} must be a number or an array of shape {lead}, got {type(x).__name__}")
    check_array(x, name, ndim=len(lead))
    a = np.asarray(to_numpy(x), dtype=np.float64)
    if tuple(a.shape) != tuple(lead):
        raise InputError(f"{name} must be a number or an array of shape {lead}, got shape {tuple(a.shape)}")
    if minimum is not None and np.any(a < minimum):
        raise InputError(f"{name} must be >= {minimum}")
    return a


def _walk_inputs(G, uniforms, c, r2, log_scale, gamma):
    Gn, U = _check_gram(G, uniforms)
    c = check_real(c, "c", minimum=0.0, strict=True)
    lead = tuple(Gn.shape[:-2])
    diag = np.maximum(np.diagonal(Gn, axis1=-2, axis2=-1), 0.0)
    r2 = _per_block(r2, lead, "r2", minimum=0.0)
    r2 = diag.max(axis=-1) if r2 is None else r2
    log_scale = _per_block(log_scale, lead, "log_scale")
    log_scale = np.zeros(lead) if log_scale is None else log_scale
    if gamma is not None:
        gamma = check_real(gamma, "gamma", minimum=0.0)
    return Gn, U, c, r2, log_scale, gamma, diag


def rule_signs(G, uniforms, *, c: float, r2=None, log_scale=None, gamma: float | None = None) -> dict:
    """Each rule's signs (numpy float64 (..., n) of +-1) on Gram ``G`` from ``uniforms``; the arguments as
    :func:`walk_diagnostics`. ``theorem`` is the walk of
    :func:`kvbounds.algorithms.self_balancing_walk.gram_walk` on G / r2 (same signs; tests compare them)."""
    Gn, U, c, r2, log_scale, gamma, _ = _walk_inputs(G, uniforms, c, r2, log_scale, gamma)
    return _signs(Gn, U, c, r2, log_scale, gamma)[0]


def walk_diagnostics(G, uniforms, *, c: float, r2=None, log_scale=None, gamma: float | None = None) -> dict:
    """The module's numbers for blocks with Gram ``G`` (..., n, n) (the Gram of the vectors the walk signs, any positive
    multiple: ``log_scale`` (...,) or a number gives the true Gram e^{log_scale} G, read only by the released rule)
    and ``uniforms`` (..., n) in [0, 1), shared by every rule. ``c``: the walk's constant (the theorem's c = 30
    log(n / delta): :func:`kvbounds.algorithms.self_balancing_walk.walk_constant`); ``r2``: R^2 in G's units (...,)
    or a number, default max_i G_ii; ``gamma``: the released rule's gamma (None: that rule is left out). Returns a
    dict of numpy float64 arrays of shape (...,) (and ``n``, ``c``)."""
    return _diagnostics(G, uniforms, c=c, r2=r2, log_scale=log_scale, gamma=gamma)[0]


def _diagnostics(G, uniforms, *, c, r2, log_scale, gamma) -> tuple[dict, dict]:
    """:func:`walk_diagnostics`'s dict and every rule's signs."""
    Gn, U, c, r2, log_scale, gamma, diag = _walk_inputs(G, uniforms, c, r2, log_scale, gamma)
    lead, n = tuple(Gn.shape[:-2]), Gn.shape[-1]
    out = dict(_shares(Gn, diag), n=n, c=c)
    signs, p_dev = _signs(Gn, U, c, r2, log_scale, gamma)
    trace = diag.sum(axis=-1)
    for rule, s in signs.items():
        disc = np.einsum("...i,...ij,...j->...", s, Gn, s)
        out[f"{rule}_disc_ratio"] = np.where(trace > 0, disc / np.where(trace > 0, trace, 1.0), 1.0)
        out[f"{rule}_equal_random"] = (np.mean(s[..., 1:] == signs["random"][..., 1:], axis=-1) if n > 1
                                       else np.ones(lead))
    out["theorem_mean_abs_p_dev"] = p_dev
    return out, signs


def _shares(G, diag) -> dict:
    absG = np.abs(G)
    tot = absG.sum(axis=(-1, -2))
    on = np.abs(np.diagonal(G, axis1=-2, axis2=-1)).sum(axis=-1)
    share = np.where(tot > 0, (tot - on) / np.where(tot > 0, tot, 1.0), 0.0)
    root = np.sqrt(diag)
    pos = root > 0
    safe = np.where(pos, root, 1.0)
    # (G_ij / r_i) / r_j: no underflow of r_i r_j; |C_ij| <= 1 for a Gram (positive semi-definite) matrix
    C = np.where(pos[..., :, None] & pos[..., None, :], G / safe[..., :, None] / safe[..., None, :], 0.0)
    if np.any(np.abs(C) > 1.0 + COSINE_TOL):
        raise InputError("G is not a Gram matrix: some |G_ij| > sqrt(G_ii G_jj) (not positive semi-definite)")
    absC = np.abs(C)
    ctot = absC.sum(axis=(-1, -2))
    con = np.abs(np.diagonal(C, axis1=-2, axis2=-1)).sum(axis=-1)
    cshare = np.where(ctot > 0, (ctot - con) / np.where(ctot > 0, ctot, 1.0), 0.0)
    n = G.shape[-1]
    off = absC * (1.0 - np.eye(n))
    coh = off.max(axis=(-1, -2)) if n > 1 else np.zeros(G.shape[:-2])
    return dict(offdiag_share=share, cosine_offdiag_share=cshare, max_coherence=coh)


def _signs(G, U, c, r2, log_scale, gamma):
    """Every rule's signs (..., n) from the same uniforms, one batched pass over the steps; the theorem walk's mean
    |p - 1/2|."""
    lead, n = G.shape[:-2], G.shape[-1]
    rules = [r for r in RULES if r != "random" and (r != "released" or gamma is not None)]
    s = {r: np.empty(lead + (n,)) for r in rules + ["random"]}
    x = {r: np.zeros(lead + (n,)) for r in rules}      # x[r][..., j] = sum_{i < step} eta_i G_ij
    pos, r2s = r2 > 0, np.where(r2 > 0, r2, 1.0)    # r2 = 0 only with G = 0 (x = 0): p = 1/2
    dev = np.zeros(lead)
    for i in range(n):
        u = U[..., i]
        coin = np.where(u < 0.5, 1.0, -1.0)
        s["random"][..., i] = coin
        with np.errstate(over="ignore"):     # x / r2 beyond float64 clips p all the same
            p = np.clip(0.5 - np.where(pos, x["theorem"][..., i] / r2s, 0.0) / (2.0 * c), 0.0, 1.0)
        dev += np.abs(p - 0.5)
        s["theorem"][..., i] = np.where(u < p, 1.0, -1.0)
        xg = x["greedy"][..., i]
        s["greedy"][..., i] = np.where(xg > 0, -1.0, np.where(xg < 0, 1.0, coin))
        if gamma is not None:
            s["released"][..., i] = 1.0 if i == 0 else np.where(u < _released_p(x["released"][..., i], gamma,
                                                                                 log_scale), 1.0, -1.0)
        for r in rules:
            x[r] += s[r][..., i, None] * G[..., i, :]
    return s, dev / n


def _released_p(x, gamma, log_scale):
    """p = 1/2 - gamma e^{log_scale} x, the product taken in logs (e^{log_scale} may overflow float64; past e^50
    the clipped p, hence the sign, is the same)."""
    t = gamma * x
    with np.errstate(divide="ignore"):
        z = np.minimum(log_scale + np.log(np.abs(t)), LOG_CLIP)
    return np.where(t == 0, 0.5, 0.5 - np.sign(t) * np.exp(z))


def block_diagnostics(K, V, *, rng: np.random.Generator | None = None, uniforms=None, scale: float | None = None,
                      delta: float = 0.01, c: float | None = None, temp: float = 1.0, const: float = 1.0,
                      beta: float = 0.0, gamma: float | None = 4.0, centre: bool = False, Q=None) -> dict:
    """:func:`walk_diagnostics` of the exp kernel (:func:`exp_kernel_gram`) of each block of K (..., n, d),
    V (..., n, s), with R^2 = e^{temp scale max||k||^2 - beta} max (||v||^2 + const) as Alg. 2 line 2 and c = 30
    log(n / delta) unless given. Uniforms: ``uniforms`` (..., n), else drawn by ``rng`` (exactly one of the two).
    Also ``key_energy``: the median over the block of temp scale ||k||^2 (after centring when ``centre``), and
    ``key_distance``: the median over pairs i < j of temp scale ||k_i - k_j||^2 / 2 (-log of their key cosine).
    ``Q`` (..., m, d), broadcasting against the blocks' leading shape: held-out queries; then also each rule's
    ``<rule>_query_num`` and ``<rule>_query_den`` (:mod:`kvbounds.algorithms.query_discrepancy`: its signs as
    those queries see them through the model's kernel e^{<k, q> scale}, the keys as given, against random signs)."""
    kg = exp_kernel_gram(K, V, scale=scale, temp=temp, const=const, beta=beta, centre=centre)
    lead, n = kg.gram.shape[:-2], kg.gram.shape[-1]
    if (rng is None) == (uniforms is None):
        raise InputError("pass exactly one of rng (a numpy Generator) and uniforms (an array of shape (..., n))")
    if rng is not None:
        uniforms = check_rng(rng).random(lead + (n,))
    if c is None:
        check_probability(delta, "delta")
        c = walk_constant(n, delta)
    out, signs = _diagnostics(kg.gram, uniforms, c=c, r2=kg.r2, log_scale=kg.log_scale, gamma=gamma)
    out.update(key_geometry(K, scale=scale, temp=temp, centre=centre))
    if Q is not None:
        for rule, s in signs.items():
            q = query_discrepancy(s, K, V, Q, scale=scale)
            out[f"{rule}_query_num"], out[f"{rule}_query_den"] = q["query_num"], q["query_den"]
    return out


def key_geometry(K, *, scale: float | None = None, temp: float = 1.0, centre: bool = False, alive=None) -> dict:
    """Per block of K (..., n, d): ``key_energy``, the median over its tokens of temp scale ||k||^2 (the exp kernel's
    log-diagonal), and ``key_distance``, the median over pairs i < j of temp scale ||k_i - k_j||^2 / 2 (-log of the
    key factor's cosine, unchanged by centring); keys centred first when ``centre``. ``alive`` (..., n) bool: only
    those tokens count (a block with none gives 0). Numpy float64 (...,)."""
    check_array(K, "K", ndim=tuple(range(2, 9)), min_rows=1)
    scale = check_scale(scale, K.shape[-1]) * check_real(temp, "temp", minimum=0.0)
    Kn = np.asarray(to_numpy(K), dtype=np.float64)
    lead, n = Kn.shape[:-2], Kn.shape[-2]
    if alive is None:
        mask = np.ones(lead + (n,), dtype=bool)
    else:
        if not hasattr(alive, "shape") or tuple(alive.shape) != lead + (n,) \
                or np.asarray(to_numpy(alive)).dtype != bool:
            raise InputError(f"alive must be a bool array of shape {lead + (n,)}")
        mask = np.asarray(to_numpy(alive))
    w = mask[..., None].astype(np.float64)
    if _check_flag(centre, "centre"):
        Kn = Kn - (Kn * w).sum(-2, keepdims=True) / np.maximum(w.sum(-2, keepdims=True), 1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        Kn = Kn * math.sqrt(scale)
        sq = np.einsum("...nd,...nd->...n", Kn, Kn)
        D = (sq[..., :, None] + sq[..., None, :] - 2.0 * np.matmul(Kn, np.swapaxes(Kn, -1, -2))) / 2
    if not (np.all(np.isfinite(sq)) and np.all(np.isfinite(D))):
        raise InputError("K too large: scale * ||k||^2 (or a pairwise distance) overflows float64")
    iu = np.triu_indices(n, 1)
    energy, dist = np.zeros(lead), np.zeros(lead)
    flat_sq, flat_D, flat_m = sq.reshape(-1, n), D.reshape(-1, n, n), mask.reshape(-1, n)
    e_out, d_out = energy.reshape(-1), dist.reshape(-1)
    for b in range(flat_sq.shape[0]):
        m = flat_m[b]
        if m.any():
            e_out[b] = np.median(flat_sq[b][m])
        pair = m[iu[0]] & m[iu[1]]
        if pair.any():
            d_out[b] = np.median(np.maximum(flat_D[b][iu[0], iu[1]][pair], 0.0))
    return dict(key_energy=energy, key_distance=dist)


def first_level_blocks(K, V, *, block_size: int, sink: int = 0, window: int = 0):
    """The blocks the first level of blockwise BalanceKV walks (BalanceKV-NeurIPS App. B; the pseudocode's and the
    released code's): the middle [sink, n - window) of K (..., n, d), V (..., n, s) cut into consecutive blocks of
    ``block_size`` tokens, a last partial block left out. Returns numpy float64 (..., blocks, b, d), (..., blocks, b, s)
    (blocks may be 0)."""
    Kn, Vn = _check_kv(K, V)
    b = check_int(block_size, "block_size", minimum=1, maximum=MAX_BLOCK)
    n = Kn.shape[-2]
    sink, window = check_int(sink, "sink"), check_int(window, "window")
    if sink + window > n:
        raise InputError(f"sink + window = {sink} + {window} exceeds the n = {n} tokens")
    nb = (n - sink - window) // b
    cut = lambda X: X[..., sink:sink + nb * b, :].reshape(X.shape[:-2] + (nb, b, X.shape[-1]))
    return cut(Kn), cut(Vn)


def blockwise_walk_cause(K, V, *, block_size: int, rng: np.random.Generator, sink: int = 0, window: int = 0,
                         kernels=tuple(KERNELS), delta: float = 0.01, Q=None) -> dict:
    """``{kernel: {"raw": summary, "centred": summary}}`` (:func:`summarize_diagnostics`) on the first-level blocks of
    blockwise BalanceKV (:func:`first_level_blocks`) of K (..., n, d), V (..., n, s), for the kernels named (keys of
    ``KERNELS``), each at the theorem's c = 30 log(block_size / delta); the record fields of a blockwise check.
    ``Q`` (..., m, d) (K's leading shape): held-out queries, which every block of a head meets (the query-side
    numbers of :func:`block_diagnostics`)."""
    Kb, Vb = first_level_blocks(K, V, block_size=block_size, sink=sink, window=window)
    if Q is not None:
        check_array(Q, "Q", ndim=K.ndim, last_dim=K.shape[-1])
        if tuple(Q.shape[:-2]) != tuple(K.shape[:-2]):
            raise InputError(f"Q must have K's leading shape {tuple(K.shape[:-2])}, got {tuple(Q.shape)}")
        Q = np.asarray(to_numpy(Q), np.float64)[..., None, :, :]
    if Kb.shape[-3] == 0:
        raise InputError(f"no full block of {block_size} tokens in the middle of {K.shape[-2]} - {sink} - {window}")
    check_rng(rng)
    if isinstance(kernels, str) or not all(k in KERNELS for k in kernels) or not kernels:
        raise InputError(f"kernels must be a non-empty sequence of {tuple(KERNELS)}, got {kernels!r}")
    check_probability(delta, "delta")
    c = walk_constant(block_size, delta)
    out = {}
    for name in kernels:
        res = centring_comparison(Kb, Vb, rng=rng, c=c, Q=Q, **KERNELS[name])
        out[name] = {side: summarize_diagnostics(res[side]) for side in ("raw", "centred")}
    return out


def centring_comparison(K, V, *, rng: np.random.Generator, **kernel) -> dict:
    """``{"raw": ..., "centred": ...}``: :func:`block_diagnostics` without and with the block's keys centred, from
    the same uniforms (``**kernel``: scale, delta, c, temp, const, beta, gamma)."""
    if "centre" in kernel or "uniforms" in kernel:
        raise InputError("centring_comparison sets centre and draws the uniforms itself")
    check_array(K, "K", ndim=tuple(range(2, 9)), min_rows=1)
    U = check_rng(rng).random(tuple(K.shape[:-1]))
    return {"raw": block_diagnostics(K, V, uniforms=U, centre=False, **kernel),
            "centred": block_diagnostics(K, V, uniforms=U, centre=True, **kernel)}


def summarize(values) -> dict:
    """Median, min, max and mean (floats) of a non-empty array or sequence of finite real numbers (per-block
    numbers; the mean is what random signs' expectation, 1 for every ratio of the diagnostics, is compared with)."""
    try:
        a = np.asarray(to_numpy(values) if hasattr(values, "shape") else values)
    except (TypeError, ValueError) as e:
        raise InputError(f"summarize needs an array of real numbers: {e}") from e
    if a.dtype.kind not in "iuf" or a.size == 0:
        raise InputError(f"summarize needs a non-empty array of real numbers, got dtype {a.dtype}, size {a.size}")
    a = a.astype(np.float64).ravel()
    if not np.all(np.isfinite(a)):
        raise InputError("summarize needs finite numbers (NaN or Inf given)")
    return dict(median=float(np.median(a)), min=float(a.min()), max=float(a.max()), mean=float(a.mean()))


QUERY_KEYS = tuple(f"{rule}_query_{side}" for rule in RULES for side in ("num", "den"))
SUMMARY_KEYS = ("offdiag_share", "cosine_offdiag_share", "max_coherence", "theorem_equal_random", "theorem_disc_ratio",
                "released_equal_random", "released_disc_ratio", "greedy_disc_ratio", "random_disc_ratio",
                "theorem_mean_abs_p_dev", "key_energy", "key_distance") + QUERY_KEYS


def summarize_diagnostics(*diagnostics: dict) -> dict:
    """{number: {median, min, max, mean}} over every block of one or more :func:`walk_diagnostics` /
    :func:`block_diagnostics` dicts (the numbers of ``SUMMARY_KEYS`` present in all of them), plus ``blocks``."""
    if not diagnostics or not all(isinstance(d, dict) for d in diagnostics):
        raise InputError("summarize_diagnostics needs one or more diagnostics dicts")
    keys = [k for k in SUMMARY_KEYS if all(k in d for d in diagnostics)]
    if not keys:
        raise InputError("no diagnostics numbers in the dicts given")
    out = {k: summarize(np.concatenate([np.ravel(np.asarray(d[k], dtype=np.float64)) for d in diagnostics]))
           for k in keys}
    out["blocks"] = int(sum(np.size(d[keys[0]]) for d in diagnostics))
    return out
