"""SG.clusters: the invariants of UpdateSoftmaxNormalizer and m' <= m (SubGen Lemma 2 / ClusterGen Lemma 2.3; the
pigeonhole step of SubGen Thm 1 / ClusterGen Thm 2.4's memory part).

After every update, with C_i the keys the algorithm assigned to cluster i (tracked labels):
(1) x_i in C_i (x_i is C_i's first key), (2) n_i = |C_i|, (3) ||x_i - k'|| <= delta for k' in C_i,
(4) ||x_i - x_j|| > delta for i != j, (5) S_i is t i.i.d. uniform samples of C_i.

Sub-checks:
  * ``invariants``  (1)-(4) and the support part of (5) (every slot holds a member of C_i, and its key)
    after every update, on random and adversarial streams (orders: random, round-robin, farthest-first,
    boundary-first, sorted; shapes: ball, sphere, touching clusters, integer lattice with distances
    exactly delta) [exact: violations = 0].
  * ``m' <= m``  streams built (m, delta)-clusterable (a partition whose parts have diameter <= delta,
    verified in floating point with the algorithm's distance formula); after every prefix the number of
    clusters m'_j is at most the number of parts met so far m_j [exact].
  * ``(5) exact``  one cluster of 4 members, t = 2: every coin outcome of the implementation enumerated
    (exact rationals); the joint law of the two slots must be uniform on C_i x C_i [exact], and the law
    propagated through lines 16-17 (:func:`kvbounds.theory.subgen.exact_cluster_slot_distribution`) uniform.
  * ``(5) gof``  one cluster of 40 members, R replicas x t slots: chi-square of the slot histogram against
    uniform, and of slot pairs against the product (independence), alpha = 1e-3.
  * control ``diameter 2 delta``: parts of diameter 2 delta fed with threshold delta violate m' <= m, so
    the m' <= m test must reject them (the check has power).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy import stats

from kvbounds.algorithms.subgen import SubGen
from kvbounds.algorithms.arrays import asarray
from kvbounds.verdict import FigureSpec, Verdict, canonical_order, standard_verdict
from kvbounds.theory.subgen import cluster_count_bound, exact_cluster_slot_distribution

from .common import dispatch, make_record, pick
from .sg_reservoir import ALPHA, chi_square, enumerate_coins, law_distance

__all__ = ["CLAIM", "SOURCE", "ORDERS", "SHAPES", "clusterable_stream", "part_diameters", "invariant_violations",
           "invariants_trial", "slots_exact_trial", "slots_gof_trial", "trials", "summarize"]

CLAIM = "SG.clusters"
SOURCE = "SubGen Lemma 2 / ClusterGen Lemma 2.3"
ORDERS = ("random", "round-robin", "farthest-first", "boundary-first", "sorted")
SHAPES = ("ball", "sphere", "touching", "lattice")


# ---------------------------------------------------------------------------------------- streams

def _dist(a, b) -> np.ndarray:
    """The algorithm's distance formula: the norm of the difference."""
    return np.linalg.norm(a - b, axis=-1)


def clusterable_stream(rng: np.random.Generator, n: int, d: int, m: int, delta: float, *, shape: str = "ball",
                       order: str = "random") -> tuple[np.ndarray, np.ndarray]:
    """Keys (n, d) and part labels (n,) of an (m, delta)-clusterable stream (every part of diameter <= delta,
    checked in floating point), in the given adversarial order.

    shape: ``ball`` (uniform in balls of radius delta/2 around separated centres), ``sphere`` (on those
    spheres: antipodal pairs at distance ~delta), ``touching`` (centres delta(1 + 1e-3) apart, so keys of
    one part lie within delta of other parts' representatives), ``lattice`` (d = 1 integer points, delta = 1
    is forced by the caller: parts {2a, 2a+1}, distances exactly delta), ``segment2`` (the control: parts of
    diameter 2 delta, their two ends first)."""
    if shape == "lattice":
        K = np.arange(n, dtype=float)[:, None] * np.ones((1, d))
        K = K / np.sqrt(d) * delta
        lab = np.arange(n) // 2
    else:
        if shape == "touching":
            centres = np.zeros((m, d))
            centres[:, 0] = np.arange(m) * delta * (1 + 1e-3)
        else:
            c = rng.standard_normal((m, d))
            centres = c / np.linalg.norm(c, axis=1, keepdims=True) * (2.0 * delta * m)
        lab = np.concatenate([np.arange(m), rng.integers(0, m, n - m)]) if n >= m else np.arange(n)
        u = rng.standard_normal((n, d))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        if shape == "segment2":
            u[:] = np.eye(d)[0]
            radius = delta * np.where(rng.random(n) < 0.5, -1.0, 1.0)
            first = np.zeros(n, bool)
            for c in range(m):
                members = np.flatnonzero(lab == c)
                radius[members[:2]] = (-delta, delta)
                first[members[:2]] = True
        elif shape == "sphere":
            radius = np.full(n, delta / 2 * (1 - 1e-9))
        else:
            radius = delta / 2 * (1 - 1e-9) * rng.random(n) ** (1.0 / d)
        K = centres[lab] + radius[:, None] * u
    perm = _order(rng, K, lab, order)
    if shape == "segment2":      # the two ends of each part lead, so the second opens a new cluster
        firsts = np.flatnonzero(first)
        perm = np.concatenate([firsts, [i for i in perm if not first[i]]])
    return K[perm], lab[perm]


def _order(rng, K, lab, order):
    n = len(K)
    if order == "random":
        return rng.permutation(n)
    if order == "round-robin":
        rank = np.zeros(n, int)
        for c in np.unique(lab):
            idx = np.flatnonzero(lab == c)
            rank[idx] = np.arange(len(idx))
        return np.lexsort((lab, rank))
    if order == "sorted":
        return np.argsort(K[:, 0], kind="stable")
    if order == "boundary-first":
        cen = np.stack([K[lab == c].mean(0) for c in range(lab.max() + 1)])
        return np.argsort(-_dist(K, cen[lab]), kind="stable")
    if order == "farthest-first":
        chosen = [0]
        mind = _dist(K, K[0])
        for _ in range(n - 1):
            mind[chosen[-1]] = -1.0
            nxt = int(np.argmax(mind))
            chosen.append(nxt)
            mind = np.minimum(mind, _dist(K, K[nxt]))
        return np.array(chosen)
    raise ValueError(f"unknown order {order!r}")


def part_diameters(K: np.ndarray, lab: np.ndarray) -> np.ndarray:
    return np.array([(_dist(K[lab == c][:, None, :], K[lab == c][None, :, :]).max() if np.sum(lab == c) > 1 else 0.0)
                     for c in np.unique(lab)])


# ------------------------------------------------------------------------------------- invariants

def invariant_violations(sg: SubGen, K: np.ndarray) -> dict[str, int]:
    """Violations of (1)-(4) and of (5)'s support after the updates so far (K: the keys seen, numpy)."""
    st, lab = sg.state(), sg.assignments()
    n, m, delta = st.n, len(st.counts), sg.delta
    K = K[:n]
    out = {"partition": int(len(lab) != n or lab.min() < 0 or lab.max() >= m)}
    out["(1) x_i in C_i"] = int(np.sum(lab[st.rep_index] != np.arange(m)) +
                                np.sum(np.any(st.representatives != K[st.rep_index], axis=1)))
    out["(2) n_i = |C_i|"] = int(np.sum(np.bincount(lab, minlength=m) != st.counts))
    out["(3) ||x_i - k|| <= delta"] = int(np.sum(_dist(st.representatives[lab], K) > delta))
    D = _dist(st.representatives[:, None, :], st.representatives[None, :, :])
    out["(4) ||x_i - x_j|| > delta"] = int(np.sum((D <= delta) & ~np.eye(m, dtype=bool)) // 2)
    si = st.sample_index                                                      # (m, R, t)
    out["(5) S_i subset of C_i"] = int(np.sum(lab[si] != np.arange(m)[:, None, None]) +
                                       np.sum(np.any(st.samples != K[si], axis=-1)))
    return out


def invariants_trial(params, seed, backend):
    n, d, m, delta = params["n"], params["d"], params["m"], params["delta"]
    rng = np.random.default_rng(seed)
    shape, order = params["shape"], params["order"]
    if params["stream"] == "clusterable":
        K, lab = clusterable_stream(rng, n, d, m, delta, shape=shape, order=order)
    else:
        K, lab = rng.standard_normal((n, d)), None
    sg = SubGen(d, delta=delta, s=2, t=params["t"], seed=seed + 1, replicas=params.get("replicas"), track=True)
    Kb = asarray(K, backend)
    Vb = asarray(np.ones((n, 1)), backend)
    viol: dict[str, int] = {}
    worst, ratio_at, mprime = 0.0, 0, 0
    for j in range(n):
        sg.update(Kb[j], Vb[j])
        for key, x in invariant_violations(sg, K).items():
            viol[key] = viol.get(key, 0) + x
        if lab is not None:
            mj = len(np.unique(lab[: j + 1]))
            if sg.num_clusters() / mj > worst:
                worst, ratio_at = sg.num_clusters() / mj, j + 1
    recs = [make_record(CLAIM, params, measured=sum(viol.values()), bound=0, bound_kind="exact", check="invariants",
                        source=SOURCE, trials=n, violations=viol, clusters=sg.num_clusters())]
    if lab is not None:
        diam = float(part_diameters(K, lab).max())
        control = shape == "segment2"
        recs.append(make_record(CLAIM, params, measured=worst, bound=cluster_count_bound(1), bound_kind="exact",
                                check="m' <= m" if not control else "m' <= m (diameter 2 delta)", control=control,
                                source="SubGen Thm 1 (memory) via Lemma 2 (1), (4)", trials=n, worst_prefix=ratio_at,
                                clusters=sg.num_clusters(), parts=int(len(np.unique(lab))), max_part_diameter=diam,
                                clusterable=bool(diam <= delta)))
    return recs


# ----------------------------------------------------------------------------------- invariant (5)

def slots_exact_trial(params, seed, backend):
    """One cluster of n_i members, t slots: the exact joint law of S_1 over all coin outcomes."""
    n_i, t = params["n"], params["t"]
    K = np.zeros((n_i, 2))
    K[:, 0] = np.arange(n_i) * 0.1                   # all within delta = 1 of the first key

    def run(coins):
        sg = SubGen(2, delta=1.0, s=1, t=t, seed=coins)
        Kb, Vb = asarray(K, backend), asarray(np.ones((n_i, 1)), backend)
        for j in range(n_i):
            sg.update(Kb[j], Vb[j])
        return tuple(int(i) for i in sg.state().sample_index[0].ravel())

    def prob(requests):
        j = sum(kind == "matrix" for kind, _ in requests[:-1])     # token index of this request
        if requests[-1][0] == "cluster":
            return Fraction(1, j + 1)                           # joins as member j + 1 (line 17: p = 1/n_i)
        return Fraction(1, j + 1)                               # line 26 with equal ||v||^2 = 1
    law = enumerate_coins(run, prob)
    uniform = {(a, b): Fraction(1, n_i * n_i) for a in range(n_i) for b in range(n_i)} if t == 2 else \
        {tuple(c): Fraction(1, n_i**t) for c in np.ndindex(*(n_i,) * t)}
    prop = exact_cluster_slot_distribution(n_i)
    return [make_record(CLAIM, params, measured=float(law_distance(law, uniform)), bound=0.0, bound_kind="exact",
                        check="(5) exact", source=SOURCE + " (5)", paths=len(law),
                        law={str(k): str(v) for k, v in sorted(law.items())}),
            make_record(CLAIM, params, measured=float(max(abs(p - Fraction(1, n_i)) for p in prop)), bound=0.0,
                        bound_kind="exact", check="(5) propagated", source=SOURCE + " (5), lines 16-17")]


def slots_gof_trial(params, seed, backend):
    n_i, t, R = params["n"], params["t"], params["replicas"]
    rng = np.random.default_rng(seed + 1)
    K = rng.standard_normal((n_i, 3)) * 0.01
    sg = SubGen(3, delta=1.0, s=1, t=t, seed=seed, replicas=R)
    Kb, Vb = asarray(K, backend), asarray(np.ones((n_i, 1)), backend)
    for j in range(n_i):
        sg.update(Kb[j], Vb[j])
    idx = sg.state().sample_index[0]                                          # (R, t)
    counts = np.bincount(idx.ravel(), minlength=n_i)
    pairs = idx[:, : t - t % 2].reshape(-1, 2)
    pc = np.bincount(pairs[:, 0] * n_i + pairs[:, 1], minlength=n_i * n_i)
    out = []
    for check, c, p in (("(5) gof uniform", counts, np.full(n_i, 1 / n_i)),
                        ("(5) gof pairs", pc, np.full(n_i * n_i, 1 / n_i**2))):
        stat, dof, pval = chi_square(c, p)
        out.append(make_record(CLAIM, params, measured=stat, bound=float(stats.chi2.isf(ALPHA, dof)), holds=pval >= ALPHA,
                               check=check, source=SOURCE + " (5)", trials=int(c.sum()), p_value=pval, dof=dof))
    return out


# ------------------------------------------------------------------------------------------ protocol

def trials(profile: str) -> list[dict]:
    n = pick(profile, smoke=48, quick=160, full=512)
    orders = pick(profile, smoke=("random", "farthest-first"), quick=ORDERS, full=ORDERS)
    shapes = pick(profile, smoke=("ball", "lattice"), quick=SHAPES, full=SHAPES)
    out = []
    for shape in shapes:
        for order in orders:
            d, delta = (1, 1.0) if shape == "lattice" else (3, 0.5)
            out.append(dict(kind="invariants", stream="clusterable", shape=shape, order=order, n=n, d=d, m=6,
                            delta=delta, t=3))
    out.append(dict(kind="invariants", stream="gaussian", shape="none", order="random", n=n, d=2, m=0, delta=0.8,
                    t=2, replicas=2))
    out += [dict(kind="invariants", stream="clusterable", shape="segment2", order=o, n=n // 2, d=2, m=4, delta=0.5,
                 t=2) for o in pick(profile, smoke=("random",), quick=("random", "sorted"), full=ORDERS)]
    out += [dict(kind="slots exact", n=n_i, t=2) for n_i in pick(profile, smoke=(3,), quick=(3, 4), full=(3, 4, 5))]
    out.append(dict(kind="slots gof", n=40, t=pick(profile, smoke=64, quick=512, full=2048), replicas=16))
    return out


def summarize(records) -> Verdict:
    figs = [FigureSpec("max over prefixes of m'_j / m_j (bound 1)", x="order", check="m' <= m", hue="shape",
                       logx=False, logy=False)]
    records = canonical_order(records)
    v = standard_verdict(CLAIM, records, figures=figs)
    mm = [r for r in records if r.check == "m' <= m"]
    if mm:
        v.summary += (f"; m' <= m on {sum(r.holds for r in mm)}/{len(mm)} clusterable streams "
                      f"(max m'/m {max(r.measured for r in mm):.3g}); invariant checks after "
                      f"{sum(r.trials for r in records if r.check == 'invariants')} updates")
    return v


run_trial = dispatch("kind", {"invariants": invariants_trial, "slots exact": slots_exact_trial},
                     default=slots_gof_trial)
