"""LB.index, the proof's steps (see :mod:`kvbounds.proofs_checks.lb_index`): one trial function per lemma of
BalanceKV-NeurIPS App. C (Lemma C.3 exact and its bounds, Lemma C.4, Corollary C.5, Lemma C.6) and for the
ranges of its conclusion; the claim's constants and the chunked instance sampler they share."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from kvbounds.algorithms.index_reduction import (SlotBatch, collisions, draw_slot_batch, eq2_error, group_attention,
                                                 lemma_sum)
from kvbounds.theory import lower_bound as lb

from .common import clopper_pearson, failure_rate_ok, make_record

__all__ = ["CLAIM", "SOURCE", "LAMBDAS_C4", "EPS_FACTORS", "FAMILIES", "PROOF_FAMILIES", "CHUNK", "instances",
           "task_c3_exact", "task_c3_bounds", "task_c4", "task_c5", "task_c6", "task_group_ones", "task_ranges"]

CLAIM = "LB.index"
SOURCE = "BalanceKV-NeurIPS Thm 3.2, App. C"
LAMBDAS_C4 = (10.0, float(lb.LEMMA_C4_LAMBDA))
EPS_FACTORS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)      # eps sqrt(n)
FAMILIES = ("Lemma C.3 exact", "Lemma C.3 bounds", "Lemma C.4", "Corollary C.5", "Lemma C.6", "conclusion",
            "game exact", "game eq2 oracle", "game compressor")
PROOF_FAMILIES = FAMILIES[:6]     # steps of the proof in BalanceKV-NeurIPS App. C: a failure is an erratum


CHUNK = 4_000_000        # slots (instances x n) per array batch: keeps memory bounded in the full profile


def instances(R: int, n: int, d: int, r: float, rng, backend, fn, **kw) -> dict:
    """Per-instance statistics fn(batch, attention) -> {name: (m,) array} over R instances, drawn and
    computed in chunks of at most CHUNK slots, concatenated."""
    outs, left = [], R
    while left:
        m = max(1, min(left, CHUNK // n))
        b = draw_slot_batch(m, n, d, r, rng, **kw)
        outs.append(fn(b, group_attention(b, backend)))
        left -= m
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


# ------------------------------------------------------------------------------------- the lemmas

def task_c3_exact(p, rng, backend):
    res = lb.lemma_c3_residuals(p["d"], variant=p["variant"])
    bad = {k: str(v) for k, v in res.items() if v != 0}
    return make_record(CLAIM, p, measured=len(bad), bound=0, bound_kind="exact", check="Lemma C.3 exact",
                       control=p["variant"] != "paper", source="BalanceKV-NeurIPS Lemma C.3", trials=len(res), nonzero=bad,
                       pairs_enumerated=4 ** p["d"])


def _c3_grid(name: str):
    Cs = {"small": ["1", "4"], "quick": ["1/2", "1", "2", "3", "4", "6", "8"],
          "full": ["1/4", "1/2", "1", "2", "3", "7/2", "4", "6", "8", "16"]}[name]
    ds = {"small": [1, 4], "quick": [1, 2, 3, 4, 8, 16, 64, 256],
          "full": [1, 2, 3, 4, 5, 8, 16, 32, 64, 256, 1024]}[name]
    fr = {"small": ["1/4", "1"], "quick": ["1/16", "1/4", "1/2", "1"],
          "full": ["1/64", "1/16", "1/4", "1/2", "3/4", "1"]}[name]
    return [(Fraction(C), d, Fraction(f) * d) for C in Cs for d in ds for f in fr]


def task_c3_bounds(p, rng, backend):
    grid = _c3_grid(p["grid"])
    steps = {k: [] for k in range(1, 5)}
    statement = []
    for C, d, r2 in grid:
        for k, res in enumerate(lb.lemma_c3_steps(C, d, r2), start=1):
            steps[k].append((res, C, d, r2))
        statement.append((lb.lemma_c3_statement(C, d, r2), C, d, r2))
    a_lo, a_hi = lb.lemma_c3_step2_threshold()
    sym = {k: str(v) for k, v in lb.lemma_c3_log_bounds_symbolic().items()}
    recs = []
    labels = {1: "1 <= exp(C^2 r^4/4d^2)", 2: "exp(C^2 r^4/4d^2) <= cosh(C r^2/d^1.5)^d",
              3: "cosh(C r^2/d^1.5)^d <= exp(C^2 r^4/d^2)", 4: "exp(C^2 r^4/d^2) <= exp(C^2)"}
    for k, rows in list(steps.items()) + [("statement", statement)]:
        fails = [(C, d, r2) for res, C, d, r2 in rows if res == "fails"]
        undecided = sum(res == "undecided" for res, *_ in rows)
        smallest = min(fails, key=lambda t: (t[0], t[1], t[2])) if fails else None
        A = lambda t: float(t[0] * t[2]) / t[1] ** 1.5
        extra = dict(step_text=labels.get(k, "1 <= cosh(C r^2/d^1.5)^d <= exp(C^2)"), grid_points=len(rows),
                     undecided=undecided, failing=[[str(C), d, str(r2)] for C, d, r2 in fails][:40])
        if smallest:
            extra.update(smallest_C=str(smallest[0]), smallest_d=smallest[1], smallest_r2=str(smallest[2]),
                         smallest_A=A(smallest), min_failing_A=min(A(t) for t in fails))
        if k == 2:
            holding = [A((C, d, r2)) for res, C, d, r2 in rows if res == "holds"]
            extra.update(A_star=[a_lo, a_hi], max_holding_A=max(holding) if holding else None)
        if k == 3:
            extra.update(symbolic=sym)
        recs.append(make_record(CLAIM, dict(p, step=str(k)), measured=len(fails), bound=0, bound_kind="exact",
                                holds=not fails and not undecided, check="Lemma C.3 bounds",
                                source="BalanceKV-NeurIPS Lemma C.3 (proof)",
                                trials=len(rows), **extra))
    return recs


def task_c4(p, rng, backend):
    d, r, G, R = p["d"], math.sqrt(p["r2"]), p["G"], p["R"]
    control = p["variant"] == "shared-key"
    st = instances(R, G * d, d, r, rng, backend, lambda b, att: dict(
        S=lemma_sum(b, att), ui=collisions(b), u=att.u, truth=b.truth), shared_key=control)
    S, ui, u, truth = st["S"], st["ui"], st["u"], st["truth"]
    ea = math.exp(lb.exponent(d, r))
    X = S - truth * ea
    mu, m2 = lb.key_moments(d, r)
    recs = []
    for lam in (LAMBDAS_C4[:1] if control else LAMBDAS_C4):
        for bit in (1, 0):
            sel = (truth == bit) & (u > 0)
            thr = lam * np.sqrt(u[sel])
            fail = np.abs(S[sel]) < ea - thr if bit else np.abs(S[sel]) > thr
            if lam == lb.LEMMA_C4_LAMBDA:
                claimed = float(np.mean([lb.lemma_c4_stated_failure(a, c) for a, c in zip(ui[sel], u[sel])]))
                how = "stated (1/1000)|U_i|/|U|"
            else:
                claimed = float(np.mean([lb.lemma_c4_chebyshev(a, c, lam) for a, c in zip(ui[sel], u[sel])]))
                how = "Chebyshev e^4|U_i|/(lam^2|U|)"
            k, m = int(fail.sum()), int(sel.sum())
            ok, pv = failure_rate_ok(k, m, claimed)
            has = ui > 0
            recs.append(make_record(
                CLAIM, dict(p, lam=lam, bit=bit), measured=k / max(m, 1), bound=claimed, holds=ok, check="Lemma C.4",
                control=control, source="BalanceKV-NeurIPS Lemma C.4", trials=m, failures=k, p_value=pv, claimed_as=how,
                ci=list(clopper_pearson(k, m)) if m else [0.0, 1.0], mean_collisions=float(ui.mean()),
                x2_over_ui=float(np.mean(X[has] ** 2 / ui[has])) if has.any() else 0.0, m2_exact=m2, mu_exact=mu,
                var_y_exact=m2 - mu * mu, m2_paper_bound=lb.LEMMA_C4_SECOND_MOMENT))
    return recs


def _c5_identity(b: SlotBatch, coords: np.ndarray) -> dict:
    """sum over Bob's group of |U_ij| against |U|, given each slot's value coordinate ``coords`` (R, G, d)."""
    R, _, d = coords.shape
    own = np.broadcast_to(np.arange(R)[:, None, None], coords.shape)
    per_coord = np.zeros((R, d), int)
    np.add.at(per_coord, (own[b.bits], coords[b.bits]), 1)                      # |U| per coordinate
    ca = coords[np.arange(R), b.group]                                           # (R, d) coordinates of group a
    ones = b.bits[np.arange(R), b.group]
    total = np.take_along_axis(per_coord, ca, axis=1).sum(1) - ones.sum(1)       # sum_j |U_ij|
    return dict(violation=total > b.bits.sum((1, 2)),
                repeated=np.array([len(set(row.tolist())) < d for row in ca]))


def task_c5(p, rng, backend):
    d, r, G, R = p["d"], math.sqrt(p["r2"]), p["G"], p["R"]
    iid = p["variant"] == "iid-coordinates"
    ea = math.exp(lb.exponent(d, r))
    lams = (lb.lemma_c4_lambda_for_stated(), float(lb.LEMMA_C4_LAMBDA))

    def stats_(b, att):
        coords = rng.integers(0, d, b.bits.shape) if iid else np.broadcast_to(np.arange(d), b.bits.shape)
        out = _c5_identity(b, coords)
        sig = b.signs[np.arange(b.R), b.group]
        S = att.z * att.D[:, None] * sig                                          # the lemma sum, every bit of group a
        ones = b.bits[np.arange(b.R), b.group]
        for j, lam in enumerate(lams):
            thr = (lam * np.sqrt(att.u))[:, None]
            out[f"fail{j}"] = np.where(ones, np.abs(S) < ea - thr, np.abs(S) > thr).any(axis=1) & (att.u > 0)
        return out

    st = instances(R, G * d, d, r, rng, backend, stats_)
    recs = [make_record(CLAIM, dict(p, stat="identity"), measured=int(st["violation"].sum()), bound=0,
                        bound_kind="exact", check="Corollary C.5", control=iid, source="BalanceKV-NeurIPS Corollary C.5", trials=R,
                        groups_with_repeated_coordinate=int(st["repeated"].sum()))]
    if iid:
        return recs
    for j, lam in enumerate(lams):
        k = int(st[f"fail{j}"].sum())
        ok, pv = failure_rate_ok(k, R, 1 - lb.COROLLARY_C5_PROB)
        recs.append(make_record(CLAIM, dict(p, stat="union bound", lam=round(lam, 3)), measured=k / R,
                                bound=1 - lb.COROLLARY_C5_PROB, holds=ok, check="Corollary C.5",
                                source="BalanceKV-NeurIPS Corollary C.5", trials=R, failures=k, p_value=pv,
                                ci=list(clopper_pearson(k, R))))
    return recs


def task_c6(p, rng, backend):
    d, r, G, R, eps = p["d"], math.sqrt(p["r2"]), p["G"], p["R"], p["eps"]

    def stats_(b, att):
        e = eq2_error(b, att, eps, p["direction"], rng)
        ok_u = att.u > 0
        scale = eps * att.softmax_norm * np.sqrt(att.u) / math.sqrt(d)           # eps/sqrt d ||s|| ||V||_F
        rho = np.abs(e[np.arange(b.R), b.coord])[ok_u] / scale[ok_u]
        noise = np.abs(lemma_sum(b, att) - b.truth * math.exp(att.a))[ok_u] / np.sqrt(att.u[ok_u] / d)
        return dict(rho=rho, noise=noise)

    st = instances(R, G * d, d, r, rng, backend, stats_)
    rho, noise = st["rho"], st["noise"]
    control = p["direction"] == "clairvoyant"
    q98 = lambda x: float(np.quantile(x, lb.LEMMA_C6_PROB))
    recs = [make_record(CLAIM, p, measured=q98(rho), bound=1.0, holds=True, bound_kind="shape",
                        check="Lemma C.6 part 1", control=control, source="BalanceKV-NeurIPS Lemma C.6 (1)", trials=len(rho),
                        mean_ratio=float(rho.mean()), max_ratio=float(rho.max()))]
    if control:
        return recs
    K = lb.lemma_c6_noise_constant()
    fail = (rho > lb.LEMMA_C6_ERROR_CONST) | (noise > K)
    k = int(fail.sum())
    ok, pv = failure_rate_ok(k, len(rho), 1 - lb.LEMMA_C6_PROB)
    recs.append(make_record(CLAIM, p, measured=k / len(rho), bound=1 - lb.LEMMA_C6_PROB, holds=ok, check="Lemma C.6",
                            source="BalanceKV-NeurIPS Lemma C.6 (proof's constants 10^4 and sqrt(1000 e^4 10^4))", trials=len(rho),
                            failures=k, p_value=pv, noise_constant=K, error_constant=lb.LEMMA_C6_ERROR_CONST))
    if p["direction"] == "random":
        recs.append(make_record(CLAIM, p, measured=q98(noise), bound=1.0, holds=True, bound_kind="shape",
                                check="Lemma C.6 part 2", source="BalanceKV-NeurIPS Lemma C.6 (2)", trials=len(noise),
                                m2_exact=lb.key_moments(d, r)[1]))
    return recs


# ------------------------------------------------------------------------------- the conclusion

def task_group_ones(p, rng, backend):
    recs = []
    for d in p["ds"]:
        P = lb.group_ones_probability(d)
        Pc = lb.group_ones_probability(d, given_bit_one=True)
        recs.append(make_record(CLAIM, dict(p, d=d), measured=float(P), bound=0.9, holds=P >= Fraction(9, 10),
                                bound_kind="exact", check="conclusion |U^i|", source="BalanceKV-NeurIPS App. C, conclusion",
                                exact=f"{P.numerator}/{P.denominator}", given_bit_one=float(Pc)))
    return recs


def task_ranges(p, rng, backend):
    d, r, G, R = p["d"], math.sqrt(p["r2"]), p["G"], p["R"]
    st = instances(R, G * d, d, r, rng, backend, lambda b, att: dict(D=att.D, sq=att.sq, u=att.u, ug=att.u_group))
    keep = st["u"] > 0
    D, sq, u, ug = st["D"][keep], st["sq"][keep], st["u"][keep], st["ug"][keep]
    m = int(keep.sum())
    lo, hi = np.array([lb.denominator_range(g, x, d, r) for g, x in zip(ug, u)]).T
    clo, chi = np.array([lb.denominator_container(x, d, r) for x in u]).T
    nlo, nhi = np.array([lb.numerator_range(g, x, d, r) for g, x in zip(ug, u)]).T
    slo, shi = np.array([lb.numerator_range_squared(g, x, d, r) for g, x in zip(ug, u)]).T
    N = np.sqrt(sq)
    recs = []
    for check, fail, below in (("conclusion denominator", (D < lo) | (D > hi), D < lo),
                               ("conclusion numerator", (N < nlo) | (N > nhi), N < nlo),
                               ("conclusion numerator^2", (sq < slo) | (sq > shi), sq < slo)):
        k = int(fail.sum())
        ok, pv = failure_rate_ok(k, m, 0.001)
        recs.append(make_record(CLAIM, p, measured=k / max(m, 1), bound=0.001, holds=ok, check=check,
                                source="BalanceKV-NeurIPS App. C, conclusion", trials=m, failures=k, below_range=int(below.sum()),
                                p_value=pv, ci=list(clopper_pearson(k, m)) if m else [0.0, 1.0]))
    # "This range is contained in [max/5, 20 max]": argued on the event |U^i| >= 0.4 d
    ev = ug >= 0.4 * d
    worst = int((((lo < clo) | (hi > chi)) & ev).sum())
    recs.append(make_record(CLAIM, p, measured=worst, bound=0, bound_kind="exact", check="conclusion containment",
                            source="BalanceKV-NeurIPS App. C, conclusion", trials=int(ev.sum()),
                            max_hi_over_20max=float(np.max(hi[ev] / chi[ev])) if ev.any() else 0.0,
                            u_above_d_ea=int((u[ev] > d * math.exp(lb.exponent(d, r))).sum())))
    return recs
