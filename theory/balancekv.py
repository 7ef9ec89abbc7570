"""Bounds of the BalanceKV family as functions of their parameters (seeds 000, 001).

Each function names its claim id and source. Constants: ``c = 30 log(n/delta)`` is proven (the walk's
own constant, 001 Alg. 3 line 2); every O(.) is returned as its *shape* (constant 1) and the checks
fit the constant, labelled "fitted". Functions prefixed ``log_`` return the natural log of the bound so
that large norms (e^{r^2/sqrt d} with r = 50, d = 64) stay finite.
"""
from __future__ import annotations

import math

WALK_C_FACTOR = 30.0          # proven: 001 Alg. 3 line 2, Alg. 2 line 3


def walk_constant(n: int, delta: float) -> float:
    """c = 30 log(n/delta). [proven]"""
    return WALK_C_FACTOR * math.log(n / delta)


def sbw_discrepancy_shape(n: int, delta: float, max_u_norm: float, u_norm: float) -> float:
    """SBW.balance (001 Thm A.1): shape log(n/delta) max_i||u_i|| ||u|| of |<sum_i eps_i u_i, u>|."""
    return math.log(n / delta) * max_u_norm * u_norm


def random_signs_discrepancy_shape(n: int, max_u_norm: float, u_norm: float) -> float:
    """The independent-random-signs reference: sqrt(n) max||u_i|| ||u|| (typical size, not a bound)."""
    return math.sqrt(n) * max_u_norm * u_norm


def log_softmax_balance_shape(n: int, s: int, delta: float, d: int, q_norm: float, max_k_norm: float,
                              max_v_norm: float) -> float:
    """SB.discrepancy (001 Thm 3.3), log of the shape
    sqrt(s) log(ns/delta) e^{||q||^2/(2 sqrt d)} e^{max||k||^2/(2 sqrt d)} max||v||."""
    return (0.5 * math.log(s) + math.log(math.log(n * s / delta)) + (q_norm**2 + max_k_norm**2) / (2 * math.sqrt(d))
            + math.log(max_v_norm))


def softmax_balance_shape(n, s, delta, d, q_norm, max_k_norm, max_v_norm) -> float:
    return math.exp(log_softmax_balance_shape(n, s, delta, d, q_norm, max_k_norm, max_v_norm))


def softmax_balance_cost(n: int, d: int, s: int) -> dict:
    """SB.cost (001 Thm 3.3): time shape (d+s) n^2, memory shape (d+s) n (floats)."""
    return {"time": (d + s) * n**2, "memory": (d + s) * n}


def merge_reduce_batch_size(eps: float, r: float, d: int, s: int, *, version: str = "001", const: float = 1.0) -> float:
    """t of Thm 3.4: sqrt(s) e^{2r^2/sqrt d}/eps (001) or e^{2r^2/sqrt d}/eps (000), times ``const``
    (the O~/O* hides constants and polylog factors: ``const`` is fitted, never proven)."""
    base = math.exp(2 * r**2 / math.sqrt(d)) / eps
    if version == "001":
        return const * math.sqrt(s) * base
    if version == "000":
        return const * base
    raise ValueError(f"version must be '000' or '001', got {version!r}")


def merge_reduce_error_bound(eps: float, j: int, r: float, d: int, max_v_norm: float) -> float:
    """MR.error (001 Thm 3.4 / 000 thm:MergeAndReduce): eps j e^{-r^2/sqrt d} max||v||. [stated]"""
    return eps * j * math.exp(-r**2 / math.sqrt(d)) * max_v_norm


def merge_reduce_eps_implied(error: float, j: int, r: float, d: int, max_v_norm: float) -> float:
    """The eps at which a measured MR error meets the bound with equality."""
    return error / (j * math.exp(-r**2 / math.sqrt(d)) * max_v_norm)


def merge_reduce_memory_bound(n: int, t: int, d: int, s: int) -> dict:
    """MR.memory (Thm 3.4): at most log2(n/t) occupied cells [stated], each |C^i| <= t [stated],
    total memory shape (d+s) t log2(n/t)."""
    levels = math.log2(max(n / t, 1.0))
    return {"occupied_cells": levels, "cell_size": t, "memory": (d + s) * t * max(levels, 1.0)}


def merge_reduce_error_shape(j: int, t: int, s: int, r: float, d: int, max_v_norm: float, delta: float) -> float:
    """The error MergeAndReduce's proof accumulates, with hidden constant 1: each of the ~j/t reductions
    at each level contributes SoftmaxBalance's discrepancy sqrt(s) log(ts/delta) e^{r^2/sqrt d} max||v||
    (Thm 3.3 with ||q||, ||k|| <= r), so error ~ (j/t) sqrt(s) log(ts/delta) e^{r^2/sqrt d} max||v||."""
    return (j / t) * math.sqrt(s) * math.log(t * s / delta) * math.exp(r**2 / math.sqrt(d)) * max_v_norm


def balance_kv_error_bound(eps: float, softmax_norm: float, v_fro: float) -> float:
    """BKV.attention (001 Thm 3.1, eq. (2)): eps ||softmax(K q/sqrt d)||_2 ||V||_F. [stated]"""
    return eps * softmax_norm * v_fro


def balance_kv_memory_shape(d: int, r: float, eps: float, *, version: str = "001") -> float:
    """BKV.memory: d sqrt(d) e^{2r^2/sqrt d}/eps (001) or e^{2r^2/sqrt d}/eps (000), polylog factors dropped."""
    base = math.exp(2 * r**2 / math.sqrt(d)) / eps
    return d * math.sqrt(d) * base if version == "001" else base


def balance_kv_bucket_count_bound(n: int, eps: float, r: float, d: int, *, rule: str = "alg1") -> float:
    """Live value-norm buckets as the proofs count them [stated]: log2(2n e^{r^2/sqrt d}/eps) for Alg. 1 line 8
    (000's proof of thm:main-theorem), log2(sqrt(n)/eps) for the threshold of 001 A.1's proof."""
    if rule == "alg1":
        return math.log2(2 * n * math.exp(r**2 / math.sqrt(d)) / eps)
    return math.log2(math.sqrt(n) / eps)


def balance_kv_bucket_count_exact(vmax_over_threshold: float) -> int:
    """The most integers i with threshold < 2^i and 2^{i-1} < vmax: floor(log2(vmax/threshold)) + 2 [derived]."""
    return math.floor(math.log2(vmax_over_threshold)) + 2
