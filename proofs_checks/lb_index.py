"""LB.index: the space lower bound of BalanceKV-NeurIPS Thm 3.2 by reduction from INDEX (App. C), step by step.

Sub-checks (record ``check``; each trial's ``task`` param says which it runs):

* ``Lemma C.3 exact``    E exp(C<x,y>/sqrt d) = cosh(C r^2/d^{3/2})^d: sympy, one coordinate and the exact
                         enumeration of all 4^d sign pairs (d <= 6) [exact]; control: d^{3/2} -> d.
* ``Lemma C.3 bounds``   the chain 1 <= e^{C^2r^4/4d^2} <= cosh^d <= e^{C^2r^4/d^2} <= e^{C^2} (r^2 <= d), step by
                         step, certified by interval arithmetic on a grid of (C, d, r^2), and the lemma's own
                         conclusion 1 <= cosh^d <= e^{C^2} ("statement") [exact].
* ``Lemma C.4``          Pr[ bit 1: |S| < e^a - lam sqrt|U| ;  bit 0: |S| > lam sqrt|U| ] against the stated
                         |U_i|/(1000|U|) (lam = 1000) and the proof's Chebyshev bound e^4 |U_i|/(lam^2|U|) (lam = 10),
                         exact binomial tests [stated]; control: every group shares one key.
* ``Corollary C.5``      sum over a group of |U_ij| <= |U| on every instance [exact]; the group-wide failure rate vs
                         0.001 [stated]; control: value coordinates drawn i.i.d. (not a partition).
* ``Lemma C.6``          explicit-constant version (coordinate error <= 10^4 eps/sqrt d ||s|| ||V||_F and
                         |X| <= 23366 sqrt(|U|/d)) vs probability 0.98 [stated]; ``Lemma C.6 part 1``/``part 2``:
                         the 98% quantiles over the O(.) shapes, growth test along d [shape]; control: an error
                         that knows Bob's coordinate (its part-1 ratio grows like sqrt d).
* ``conclusion |U^i|``   Pr[|U^i| >= 0.4 d] vs the stated 0.9, exactly [stated].
* ``conclusion denominator`` / ``containment`` / ``numerator`` / ``numerator^2``  the ranges of the proof's
                         conclusion, by Monte Carlo vs the stated 0.999 (containment: exact).
* ``game exact``         the whole reduction with exact attention: Bob's success over the n ladder; ``game exact
                         constant``: the largest n that still gives 0.8, as n / (d e^{2a}) = 1/C [shape].
                         Control: the literal decoder (ignores sigma_i).
* ``game eq2 oracle``    exact attention + an error of exactly eq. (2)'s size (random / adversarial direction);
                         ``game eq2 oracle constant``: n / min{1/eps_crit^2, d e^{2a}} [shape].
* ``game compressor NAME`` real compressors with M pairs: Bob's success vs the Fano ceiling of their state size
                         [a-priori, information theory]; ``game compressor NAME constant``: M at 80% vs n [shape].
                         Control: a compressor told Bob's index.

The game's curve points (``game exact``, ``game eq2 oracle``) are data, not claims: the paper asserts 0.8 only at
n = min{...}/C for an unspecified constant C, so they carry holds=True and ``extra["meets_08"]`` (exact binomial test
against 0.8); the ``constant`` records and the controls decide. Bob's success is measured on his own bit (one per
game, so the binomial tests are exact); ``group_accuracy`` (every bit of his group, same query) is the smoother
estimate of the same probability. summarize() gives a verdict per lemma/step family and one for the reduction.

Under the shared rules (kvbounds.verdict): a lower bound cannot be refuted by sampling, so the statement is at best
``not-refuted``; a proof step that fails as written is an erratum (where, what, smallest input, corrected step),
never a refutation; the reduction's constant (n_max = d e^{2a}/C) is the fitted constant.

Modules: this one holds the trial grid and dispatch (``trials``, ``run_trial``) and re-exports the rest:
:mod:`.lb_index_proof_steps` (the lemmas' and the conclusion's trials, the claim's constants),
:mod:`.lb_index_games` (the INDEX game: exact, eq. (2) oracle, real compressors), :mod:`.lb_index_verdict`
(``summarize``, errata and findings).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.compressor_adapters import subgen_class
from .common import pick
from .lb_index_games import game_compressor, game_eq2, game_exact
from .lb_index_proof_steps import (CHUNK, CLAIM, EPS_FACTORS, FAMILIES, LAMBDAS_C4, PROOF_FAMILIES,  # noqa: F401
                                   SOURCE, task_c3_bounds, task_c3_exact, task_c4, task_c5, task_c6, task_group_ones, instances, task_ranges)
from .lb_index_verdict import family, summarize  # noqa: F401 - the check module's summarize

__all__ = ["trials", "TASKS", "run_trial"]

# ------------------------------------------------------------------------------------------ trials

def _ladder(d: int, r2: float, cap_groups: int, cap_n: int) -> list[int]:
    """Group counts G = 1, 2, 4, ... with G <= e^{2a} (n <= d e^{2a}), G <= cap_groups and G d <= cap_n."""
    top = math.exp(2 * r2 / math.sqrt(d))
    out, G = [], 1
    while G <= min(top, cap_groups) and G * d <= cap_n:
        out.append(G)
        G *= 2
    return out


def trials(profile: str) -> list[dict]:
    out = [dict(task="c3 exact", d=d, variant="paper") for d in pick(profile, smoke=[2], quick=range(1, 7),
                                                                      full=range(1, 9))]
    out.append(dict(task="c3 exact", d=3, variant="wrong-power"))
    out.append(dict(task="c3 bounds", grid=pick(profile, smoke="small", quick="quick", full="full")))
    R4 = pick(profile, smoke=300, quick=2000, full=20000)
    pts = pick(profile, smoke=[(16, 16, 4)], quick=[(16, 16, 64), (64, 16, 64), (64, 64, 16), (256, 128, 8)],
               full=[(16, 16, 64), (64, 16, 64), (64, 64, 16), (64, 64, 128), (256, 128, 8), (256, 256, 16)])
    for d, r2, G in pts:
        out.append(dict(task="c4", d=d, r2=r2, G=G, R=R4, variant="construction"))
        out.append(dict(task="c5", d=d, r2=r2, G=G, R=R4, variant="construction"))
    out.append(dict(task="c4", d=64, r2=64, G=16, R=pick(profile, smoke=200, quick=1000, full=4000),
                    variant="shared-key"))
    out.append(dict(task="c5", d=16, r2=16, G=16, R=pick(profile, smoke=50, quick=200, full=1000),
                    variant="iid-coordinates"))
    R6 = pick(profile, smoke=200, quick=2000, full=10000)
    for d in pick(profile, smoke=[4, 16], quick=[4, 16, 64, 256], full=[4, 16, 64, 256, 1024]):
        for direction in ("random", "adversarial", "clairvoyant"):
            out.append(dict(task="c6", d=d, r2=d, G=16, R=R6, eps=0.1, direction=direction))
    out.append(dict(task="group ones", ds=pick(profile, smoke=[4, 64], quick=[1, 2, 4, 8, 16, 32, 43, 44, 64, 128, 256],
                                              full=list(range(1, 65)) + [128, 256, 512])))
    Rr = pick(profile, smoke=200, quick=2000, full=10000)
    for d, r2, G in pick(profile, smoke=[(16, 16, 1), (16, 16, 16)],
                         quick=[(16, 16, 1), (16, 16, 2), (16, 16, 64), (16, 4, 7), (64, 16, 8), (64, 16, 32),
                                (64, 64, 64), (256, 128, 16)],
                         full=[(16, 16, 1), (16, 16, 2), (16, 16, 64), (16, 16, 1024), (16, 4, 7), (64, 16, 8),
                               (64, 16, 32), (64, 64, 64),
                               (64, 64, 1024), (256, 128, 16)]):
        out.append(dict(task="ranges", d=d, r2=r2, G=G, R=Rr))
    Rg = pick(profile, smoke=100, quick=600, full=3000)
    cap_g, cap_n = pick(profile, smoke=(4, 256), quick=(256, 16384), full=(1024, 131072))
    combos = pick(profile, smoke=[(16, 16)], quick=[(4, 4), (16, 16), (64, 16), (64, 48), (64, 64), (256, 128)],
                  full=[(4, 4), (16, 4), (16, 16), (64, 16), (64, 36), (64, 48), (64, 64), (256, 64), (256, 128),
                        (256, 256)])
    for d, r2 in combos:
        for rule in ("abs", "signed"):
            out.append(dict(task="game exact", d=d, r2=r2, rule=rule, R=Rg, Gs=_ladder(d, r2, cap_g, cap_n)))
    out.append(dict(task="game exact", d=16, r2=16, rule="literal", R=pick(profile, smoke=1000, quick=3000, full=10000),
                    Gs=[1]))
    Re = pick(profile, smoke=100, quick=600, full=3000)
    for d, r2, G in pick(profile, smoke=[(64, 64, 4)], quick=[(64, 64, 4), (64, 64, 16), (64, 64, 64), (256, 128, 16)],
                         full=[(64, 64, 4), (64, 64, 16), (64, 64, 64), (64, 64, 256), (256, 128, 4), (256, 128, 16),
                               (256, 128, 64)]):
        for direction in ("random", "adversarial"):
            out.append(dict(task="game eq2", d=d, r2=r2, G=G, R=Re, direction=direction, rule="abs"))
    names = ["uniform", "blockwise", "balancekv"] + (["subgen"] if subgen_class() is not None else [])
    for name in names:
        ns = pick(profile, smoke=[128], quick=[256, 512] if name == "balancekv" else [256, 1024],
                  full=[256, 1024, 4096])
        for n in ns:
            if profile == "smoke" and name != "uniform":
                continue
            reps = pick(profile, smoke=8, full=200,
                        quick={"balancekv": 24, "subgen": 32, "blockwise": 96, "uniform": 160}[name])
            settings = pick(profile, smoke=[2, 5], quick=[0, 1, 2, 3, 4] if name == "balancekv" else list(range(6)),
                            full=[0, 1, 2, 3, 4] if name == "balancekv" else list(range(6)))
            out.append(dict(task="game compressor", name=name, d=64, r2=64, n=n, R=reps, settings=settings))
    out.append(dict(task="game compressor", name="clairvoyant", d=64, r2=64,
                    n=pick(profile, smoke=128, quick=256, full=256),
                    R=pick(profile, smoke=20, quick=40, full=100), settings=[0]))
    return out


TASKS = {"c3 exact": task_c3_exact, "c3 bounds": task_c3_bounds, "c4": task_c4, "c5": task_c5, "c6": task_c6, "group ones": task_group_ones,
         "ranges": task_ranges, "game exact": game_exact, "game eq2": game_eq2, "game compressor": game_compressor}


def run_trial(params: dict, seed: int, backend: str):
    task = params.get("task")
    if task not in TASKS:
        raise ValueError(f"unknown LB.index task {task!r}; known: {', '.join(TASKS)}")
    return TASKS[task](params, np.random.default_rng(seed), backend)
