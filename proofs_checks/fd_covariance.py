"""FD.covariance: the Frequent Directions guarantee (Subspace-FD-draft Sec. 8; Liberty 2013; GLPW16 Thm 1.1, Alg. 2).

For the sketch S (all rows held, buffered ones included) and its certificate Delta (total shrinkage), and
for every r < l:  0 <= A^T A - S^T S  and  ||A^T A - S^T S||_op <= Delta <= ||A - A_r||_F^2 / (l - r).
The same for the compact sketch (at most l rows). Sub-checks (``check`` field; "(l rows)" for compact):
  * ``psd``                    -lambda_min(A^T A - S^T S) / ||A||_F^2 against a floating tolerance [exact],
  * ``error<=certificate``     ||A^T A - S^T S|| against Delta (+ tolerance) [certificate],
  * ``certificate<=bound``     Delta against min_{r<l} ||A - A_r||_F^2/(l-r) (+ tolerance) [proven],
  * ``error<=bound``           the claim's own inequality, ratio = how loose the bound is [proven],
  * ``mass``                   ||A||_F^2 - ||S||_F^2 >= l Delta (each shrink by delta removes >= l delta of squared
                               Frobenius mass: the inequality the proof of the bound rests on) [exact],
  * ``rows<=l``                the compact sketch has at most l rows [exact].
Everything is measured on A / max|A| (so scales 1e-100 .. 1e100 compare in the same units).

Floating tolerance: each shrink is one SVD with backward error O(eps ||B||^2) in B^T B, and ||B||_F <= ||A||_F,
so tol = 64 eps (shrinks + 2) ||A||_F^2 (a derived constant, never tuned; violations of the broken variants
below are of the order of a row's squared norm, ~1e-2 ||A||_F^2).

Negative controls (records with control=True): the three known ways public FD code breaks its guarantee,
each run on an input that triggers it; the check must reject each one:
  * ``drop-buffer``      get() returns only the first l rows, dropping the rows buffered since the last shrink;
  * ``unclamped-sqrt``   the shrink takes singular values as sqrt(eig(B B^T)) without clamping: NaN on
                         rank-deficient or repeated rows;
  * ``stale-rows``       rows staged in fixed batches, and the last, partial batch is inserted whole: rows of
                         the previous batch are read again when n is not a multiple of the batch.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.frequent_directions import FrequentDirections
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.verdict import Constant, FigureSpec, Verdict, canonical_order, standard_verdict
from kvbounds.theory.frequent_directions import covariance_bound_from_sv, covariance_error, singular_values
from kvbounds.traces.rope import rope_trace
from kvbounds.traces.synthetic import make_trace

from kvbounds.battery import random_basis_sketch, random_projection_sketch
from kvbounds.battery import method_floats, sketch_controls, stream_floats
from kvbounds.battery import power_on_both_metrics

from .common import dispatch, make_record, pick
from kvbounds.streams import POWER_CHECK, battery_record, streams_per_family

CLAIM = "FD.covariance"
SOURCE = "Subspace-FD-draft Sec. 8 (Liberty 2013; GLPW16 Thm 1.1)"
KINDS = ("gaussian", "low_rank", "power_law", "rank_deficient", "repeated", "zero_rows", "huge", "tiny", "rope")
CONTROLS = ("drop-buffer", "unclamped-sqrt", "stale-rows")


# -- the three broken variants (negative controls; also used by tests/algorithms/test_frequent_directions.py) --------

class DropBufferedFD(FrequentDirections):
    """BROKEN on purpose: get() returns only the first l buffer rows; rows inserted since the last shrink
    beyond row l are dropped."""

    def sketch(self, compact: bool = False):
        return self._buf[:min(self._next, self.ell), :]


class UnclampedSqrtFD(FrequentDirections):
    """BROKEN on purpose: singular values as sqrt of the eigenvalues of B B^T, unclamped. A rank-deficient
    buffer has eigenvalues -1e-16 |B|^2, whose square root is NaN, and the NaN spreads into the sketch."""

    def _shrink(self) -> None:
        B = to_numpy(self._buf[:self._next, :])
        if not np.all(np.isfinite(B)):                              # NaN from an earlier shrink: it stays
            B = np.full_like(B, np.nan)
            lam, U = np.full(B.shape[0], np.nan), np.eye(B.shape[0])
        else:
            lam, U = np.linalg.eigh(B @ B.T)
        lam, U = lam[::-1], U[:, ::-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.sqrt(lam)                                        # the bug: no max(lam, 0)
            keep = self.ell - 1
            delta = s[keep] ** 2
            new = np.sqrt(s[:keep] ** 2 - delta)
            rows = (new / s[:keep])[:, None] * (U[:, :keep].T @ B)
        buf = np.zeros_like(B, shape=(2 * self.ell, self.d))
        buf[:keep] = rows
        self._buf, self._next = buf, keep
        self._delta += float(delta)
        self.n_shrinks += 1


class StaleRowsFD(FrequentDirections):
    """BROKEN on purpose: rows are staged in batches of ``batch``; sketch() inserts the whole staging array,
    so when n is not a multiple of the batch, rows of the previous batch are inserted a second time."""

    def __init__(self, d: int, ell: int, batch: int | None = None):
        super().__init__(d, ell)
        self.batch = batch or ell + 1
        self._stage = np.zeros((self.batch, d))
        self._fill = 0

    def update(self, rows):
        rows = np.atleast_2d(to_numpy(rows))
        for row in rows:
            self._stage[self._fill] = row
            self._fill += 1
            if self._fill == self.batch:
                super().update(self._stage.copy())
                self._fill = 0
        return self

    def sketch(self, compact: bool = False):
        if self._fill:
            super().update(self._stage.copy())                      # the bug: the stale tail is read again
            self._fill = 0
        return super().sketch(compact)


BROKEN = {"drop-buffer": DropBufferedFD, "unclamped-sqrt": UnclampedSqrtFD, "stale-rows": StaleRowsFD}


# -- inputs --------------------------------------------------------------------------------------------

def make_matrix(kind: str, n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind in ("gaussian", "huge", "tiny"):
        A = rng.standard_normal((n, d)) * {"gaussian": 1.0, "huge": 1e100, "tiny": 1e-100}[kind]
    elif kind == "low_rank":
        A = make_trace("low_rank", n=n, d=d, seed=rng, rank=min(4, d)).K
    elif kind == "power_law":
        U = np.linalg.qr(rng.standard_normal((n, min(n, d))))[0]
        V = np.linalg.qr(rng.standard_normal((d, min(n, d))))[0]
        A = (U * (1.0 / np.arange(1, min(n, d) + 1))) @ V.T
    elif kind == "rank_deficient":
        A = rng.standard_normal((n, 2)) @ rng.standard_normal((2, d))
    elif kind == "repeated":
        A = np.repeat(rng.standard_normal((1, d)), n, axis=0)
        A[::7] *= 3.0                                            # a few scaled copies, still rank 1
    elif kind == "zero_rows":
        A = rng.standard_normal((n, d))
        A[rng.random(n) < 0.5] = 0.0
    elif kind == "rope":
        A = rope_trace(n, d + d % 2, rank=min(4, d), seed=rng).K[:, :d]
    else:
        raise ValueError(f"unknown matrix kind {kind!r}")
    return A


def feed(fd: FrequentDirections, A, seed: int, backend: str = "numpy") -> FrequentDirections:
    """Stream A into fd in blocks of random sizes 1..2l+3 (so block and buffer boundaries never align)."""
    rng = np.random.default_rng(seed + 7)
    Ab = asarray(A, backend)
    i = 0
    while i < A.shape[0]:
        k = int(rng.integers(1, 2 * fd.ell + 4))
        fd.update(Ab[i:i + k])
        i += k
    return fd


def tolerance(n_shrinks: int) -> float:
    """Relative floating tolerance (units of ||A||_F^2), derived in the module docstring."""
    return 64 * np.finfo(float).eps * (n_shrinks + 2)


def measure(A: np.ndarray, S, delta: float, ell: int, n_shrinks: int) -> dict:
    """The claim's quantities on A / max|A|: psd violation, ||A^T A - S^T S||, Delta, min_r eps_r, tolerance."""
    S = np.asarray(to_numpy(S), float)
    c = float(np.abs(A).max()) or 1.0
    An, Sn, dn = A / c, S / c, delta / c**2
    fro2 = float(np.sum(An**2)) or 1.0
    tol = tolerance(n_shrinks) * fro2
    bound = covariance_bound_from_sv(singular_values(An), ell)
    if not (np.all(np.isfinite(Sn)) and math.isfinite(dn)):
        return dict(finite=False, psd=math.inf, error=math.inf, delta=math.inf, bound=bound, tol=tol, fro2=fro2,
                    rows=S.shape[0], mass=math.inf)
    err, lam_min = covariance_error(An, Sn)
    mass = max(0.0, ell * dn - (float(np.sum(An**2)) - float(np.sum(Sn**2)))) / fro2   # violation of the mass inequality
    return dict(finite=True, psd=max(0.0, -lam_min) / fro2, error=err, delta=dn, bound=bound, tol=tol, fro2=fro2,
                rows=S.shape[0], mass=mass)


def violations(m: dict, ell: int | None = None) -> dict:
    """Which parts of the guarantee a measurement breaks (empty dict: none)."""
    out = {}
    if not m["finite"]:
        out["finite"] = "sketch or certificate is NaN/Inf"
    if m["psd"] > m["tol"] / m["fro2"]:
        out["psd"] = m["psd"]
    if m["mass"] > m["tol"] / m["fro2"]:
        out["mass"] = m["mass"]
    if m["error"] > m["delta"] + m["tol"]:
        out["error<=certificate"] = (m["error"], m["delta"])
    if m["delta"] > m["bound"] + m["tol"]:
        out["certificate<=bound"] = (m["delta"], m["bound"])
    if m["error"] > m["bound"] + m["tol"]:
        out["error<=bound"] = (m["error"], m["bound"])
    if ell is not None and m["rows"] > ell:
        out["rows<=l"] = m["rows"]
    return out


# -- protocol ------------------------------------------------------------------------------------------

def trials(profile: str) -> list[dict]:
    ells = pick(profile, smoke=[4], quick=[4, 16], full=[2, 4, 16, 32])
    ds = pick(profile, smoke=[6, 32], quick=[6, 64, 128], full=[3, 6, 64, 128, 512])
    out = []
    for ell in ells:
        ns = sorted({ell - 1 if ell > 1 else 1, 2 * ell - 1, 2 * ell, 2 * ell + 1, 7 * ell + 3}
                    | set(pick(profile, smoke=[], quick=[20 * ell + 5, 100 * ell + 1],
                                                    full=[20 * ell + 5, 100 * ell + 1, 1000 * ell + 7])))
        kinds = pick(profile, smoke=("gaussian", "repeated", "huge"), quick=KINDS, full=KINDS)
        out += [dict(kind=k, n=n, d=d, ell=ell, variant="fd") for k in kinds for n in ns for d in ds]
    # each negative control on an input that triggers its bug
    ell = 4
    out += [dict(kind="gaussian", n=2 * ell - 1, d=32, ell=ell, variant="drop-buffer"),
            dict(kind="repeated", n=20 * ell + 5, d=32, ell=ell, variant="unclamped-sqrt"),
            dict(kind="gaussian", n=5 * (ell + 1) + 2, d=32, ell=ell, variant="stale-rows")]
    out += [dict(kind=k, n=pick(profile, smoke=64, quick=256, full=1024), d=64, ell=16, variant="fd", sweep="power",
                 rep=i) for k in pick(profile, smoke=POWER_KINDS[:1], quick=POWER_KINDS, full=POWER_KINDS)
            for i in range(streams_per_family(profile))]
    return out


def statement_trial(params: dict, seed: int, backend: str):
    kind, n, d, ell, variant = params["kind"], params["n"], params["d"], params["ell"], params["variant"]
    A = make_matrix(kind, n, d, seed)
    if variant == "fd":
        fd = feed(FrequentDirections(d, ell), A, seed, backend)
        recs = []
        for compact, tag in ((False, ""), (True, " (l rows)")):
            m = measure(A, fd.sketch(compact), fd.certificate(compact), ell, fd.n_shrinks + compact)
            recs += _records(params, m, tag, n_shrinks=fd.n_shrinks)
            if compact:
                recs.append(make_record(CLAIM, params, measured=m["rows"], bound=ell, check="rows<=l",
                                        bound_kind="exact", source="GLPW16 Alg. 2"))
        return recs
    fd = feed(BROKEN[variant](d, ell), A, seed)
    m = measure(A, fd.sketch(), fd.certificate(), ell, fd.n_shrinks)
    bad = violations(m)
    worst = math.inf if not m["finite"] else max(
        m["psd"] * m["fro2"] / m["tol"], m["mass"] * m["fro2"] / m["tol"], m["error"] / (m["delta"] + m["tol"]),
        m["delta"] / (m["bound"] + m["tol"]), m["error"] / (m["bound"] + m["tol"]))
    return make_record(CLAIM, params, measured=worst, bound=1.0, holds=not bad, check=f"control {variant}",
                       control=True, source=SOURCE, violated=sorted(bad), n_shrinks=fd.n_shrinks)


def _records(params, m, tag, n_shrinks):
    common = dict(n_shrinks=n_shrinks, tol=m["tol"], delta=m["delta"], bound_eps=m["bound"], fro2=m["fro2"])
    return [
        make_record(CLAIM, params, measured=m["psd"], bound=m["tol"] / m["fro2"], check="psd" + tag,
                    bound_kind="exact", source=SOURCE, **common),
        make_record(CLAIM, params, measured=m["mass"], bound=m["tol"] / m["fro2"], check="mass" + tag,
                    bound_kind="exact", source="GLPW16 proof of Thm 1.1", **common),
        make_record(CLAIM, params, measured=m["error"], bound=m["delta"] + m["tol"], check="error<=certificate" + tag,
                    bound_kind="certificate", source=SOURCE, **common),
        make_record(CLAIM, params, measured=m["delta"], bound=m["bound"] + m["tol"], check="certificate<=bound" + tag,
                    source=SOURCE, **common),
        make_record(CLAIM, params, measured=m["error"], bound=m["bound"] + m["tol"], check="error<=bound" + tag,
                    source=SOURCE, **common),
    ]


def summarize(records) -> Verdict:
    """Every bound here is exact (no hidden constant): the statement is decided by the records, the three
    broken variants are the controls, and the proven constant is the bound's own 1/(l - r)."""
    records = canonical_order(records)
    n_all = len(records)
    pw = [r for r in records if r.check == POWER_CHECK]
    trivial = power_on_both_metrics(pw, setting=lambda r: r.params["kind"], metric="||A^T A - S^T S|| / ||A||_F^2")
    records = [r for r in records if r.check != POWER_CHECK]
    figs = [FigureSpec("||A^T A - S^T S|| / min_r ||A-A_r||_F^2/(l-r) vs n", x="n", check="error<=bound", hue="kind",
                       y="ratio", logy=False),
            FigureSpec("||A^T A - S^T S|| / Delta (certificate) vs n", x="n", check="error<=certificate", hue="kind",
                       y="ratio", logy=False)]
    parts = []
    for check in ("error<=bound", "certificate<=bound", "error<=certificate"):
        rs = [r for r in records if r.check == check and not r.control and r.bound > 0]
        if rs:
            q = np.array([r.ratio for r in rs])
            parts.append(f"{check}: ratio max {q.max():.3g}, median {np.median(q):.3g}")
    psd = [r.measured for r in records if r.check.startswith("psd")]
    if psd:
        parts.append(f"worst PSD violation {max(psd):.2g} ||A||_F^2")
    for r in (r for r in records if r.control):
        parts.append(f"control {r.params['variant']}: {'rejected' if not r.holds else 'NOT rejected'} "
                     f"({', '.join(r.extra.get('violated', [])) or 'no violation'})")
    eb = [r.ratio for r in records if r.check == "error<=bound" and not r.control and r.bound > 0]
    proven = Constant(1.0, "proven", "||A^T A - S^T S|| <= 1 x ||A - A_r||_F^2/(l - r) (GLPW16 Thm 1.1, exact constant)"
                      + (f"; max measured/bound {max(eb):.3g}" if eb else ""))
    if pw:
        opt = {}
        for r in pw:
            ref = r.extra.get("reference", {}).get("best_rank")
            if ref:
                opt.setdefault(r.params["kind"], []).append(r.measured / ref)
        parts.append("FD (its 2l-row buffer) / best rank-l error (the optimum, a reference): " + ", ".join(
            f"{k} median {np.median(v):.3g}" for k, v in sorted(opt.items())))
        parts.append(ablation_words(pw))
    parts.append(trivial.detail)
    v = standard_verdict(CLAIM, records, figures=figs, proven=proven, trivial=trivial)
    v.summary = "; ".join([v.summary] + parts)
    v.n_records = n_all
    return v


# ------------------------------------------------------------------ power against the battery of sketches
POWER_KINDS = ("gaussian", "low_rank", "power_law", "rope")


ABLATION = ("a Gaussian random-projection sketch at FD's floats (2l rows, the calls' ablation: "
            "kvbounds.battery.random_projection_sketch)")


def ablation_words(records) -> str:
    """FD against its ablation and against the former one, per family (medians of the per-stream ratios FD / it):
    the random projection the calls use, and the data-blind random basis kept as a reference (not a control)."""
    def ratios(get):
        out: dict[str, list] = {}
        for r in records:
            x = get(r)
            if isinstance(x, (int, float)) and x > 0:
                out.setdefault(r.params["kind"], []).append(r.measured / x)
        return out
    proj = ratios(lambda r: r.extra.get("controls", {}).get("ablation"))
    basis = ratios(lambda r: r.extra.get("reference", {}).get("random_basis"))
    text = f"FD / {ABLATION}: " + ", ".join(f"{k} median {np.median(v):.3g}" for k, v in sorted(proj.items()))
    if basis:
        text += ("; FD / a data-blind random basis of the same rank (a reference only, not a control: it ignores the "
                 "data's directions): " + ", ".join(f"{k} median {np.median(v):.3g}" for k, v in sorted(basis.items())))
    return text


def sketch_floats(fd: FrequentDirections) -> int:
    """FD's floats as it streams: the 2l-row buffer and Delta (kvbounds.battery.method_floats)."""
    return method_floats(fd)


def power_trial(params: dict, seed: int, backend: str):
    """||A^T A - S^T S||_op / ||A||_F^2 of FD's sketch (every row it holds, buffered rows included: what its 2l-row
    buffer answers with) and of the battery's sketches at the same floats (kvbounds.battery.sketch_controls, 2l
    rows: zeros (S = 0: sigma_1^2), the mean row scaled by sqrt(n), StreamingLLM's first 4 and most recent rows, a
    uniform sample of rows scaled by sqrt(n / kept)); the ablation: a Gaussian random-projection sketch with as many
    rows as the floats hold, 2l (kvbounds.battery.random_projection_sketch: FD's shrinking replaced by chance,
    counted the same way). References in ``extra["reference"]``, not controls to beat: the best rank-l approximation
    (sigma_{l+1}^2, the optimum no sketch beats) and A's Gram in a data-blind random basis of rank l
    (``random_basis``: kvbounds.battery.random_basis_sketch, the former ablation, a straw man)."""
    n, d, ell = params["n"], params["d"], params["ell"]
    A = make_matrix(params["kind"], n, d, seed)
    fd = feed(FrequentDirections(d, ell), A, seed, backend)
    S = np.asarray(to_numpy(fd.sketch()), float)
    G = A.T @ A
    fro2 = float(np.sum(A**2)) or 1.0
    err = lambda S_: float(np.linalg.norm(G - S_.T @ S_, 2)) / fro2
    held = sketch_floats(fd)
    rng = np.random.default_rng(seed + 11)
    sk = sketch_controls(A, held, rng, ablation=lambda A, f, rng: random_projection_sketch(A, f // A.shape[1], rng))
    sv = singular_values(A)
    floats = {k: v.shape[0] * d + (k in ("uniform", "mean")) for k, v in sk.items()}
    basis = err(random_basis_sketch(A, ell, np.random.default_rng(seed + 13)))
    return battery_record(CLAIM, params, SOURCE, err(S), {k: err(v) for k, v in sk.items()}, method_floats=held,
                          stream_floats=stream_floats(n, d), controls_floats=floats,
                          reference=dict(best_rank=float(sv[ell] ** 2 / fro2) if len(sv) > ell else 0.0,
                                         random_basis=basis))


run_trial = dispatch("sweep", {"power": power_trial}, default=statement_trial)
