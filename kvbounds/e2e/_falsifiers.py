"""SUB.lowrank's perplexity falsifier through the end-to-end harness, as functions the SUB.lowrank check calls.

The subspace draft (Subspace-FD-draft, Sec. 11 falsifier 1) hypothesises that a layer's keys and values live near
a low-rank subspace, so projecting them costs little end to end. :func:`window_rows` projects every layer's middle
keys/values of one window of real text onto their top-r subspace
(:class:`kvbounds.algorithms.compressor_adapters.SubspaceCompressor`, r from the float budget; first/last
``window`` tokens exact) and measures the held-out per-token NLL increase against exact attention, with uniform
sampling at the same memory as the reference. The unit is the window: the tokens of one window are not
independent, so :func:`window_effects` gives t intervals over the windows' mean per-token increases, and the
paired (subspace - uniform) Hodges-Lehmann interval of the one rule that says whether the subspace beats uniform
at equal memory.
"""
from __future__ import annotations

import numpy as np

from ._leaderboard import t_interval


def window_rows(lm, index: int, *, n: int = 512, cont: int = 32, budgets=(0.25, 0.5), window: int = 32) -> list[dict]:
    """One window of the text (:func:`kvbounds.e2e._tasks.ppl_task`): per (method, budget) of subspace and uniform,
    {"method", "budget", "delta_nll" (mean per-token NLL(method) - NLL(exact)), "memory_fraction", "rank",
    "exact_nll", "n_tokens"}."""
    from kvbounds.algorithms.compressor_adapters import SubspaceCompressor
    from . import _tasks as tasks
    from ._harness import run_cell
    task = tasks.ppl_task(lm, n, cont + 1, index)
    rows = run_cell(lm, task, ["subspace", "uniform"], budgets, sink=window, window=window)
    ex = np.asarray(rows[0]["ll"])
    out = []
    for r in rows[1:]:
        if r["error"]:
            raise RuntimeError(f"{r['method']} @{r['budget']:g}: {r['error']}")
        left = int(r["budget"] * n * 2 * lm.head_dim) - 2 * window * 2 * lm.head_dim
        rank = SubspaceCompressor(window, window).rank_for(n - 2 * window, lm.head_dim, left) \
            if r["method"] == "subspace" else None
        out.append(dict(method=r["method"], budget=float(r["budget"]),
                        delta_nll=float((ex - np.asarray(r["ll"])).mean()),
                        memory_fraction=float(r["memory_floats"] / rows[0]["memory_floats"]), rank=rank,
                        exact_nll=float(-ex.mean()), n_tokens=int(len(ex))))
    return out


def window_effects(sub: dict, uni: dict) -> dict:
    """``sub``, ``uni``: window -> mean per-token NLL increase over exact at one budget. Returns the subspace's
    mean and 95% t interval over windows (a description of its level), the perplexity factor's interval
    exp(ci) - 1, and the paired difference subspace - uniform on shared windows as the one rule states it
    (:func:`kvbounds.verdict.hodges_lehmann`: the Hodges-Lehmann estimate ``diff`` and its signed-rank interval
    ``diff_ci``; the call itself is :func:`kvbounds.verdict.paired_calls`')."""
    from kvbounds.verdict import hodges_lehmann
    w = sorted(set(sub) & set(uni))
    s = np.array([sub[k] for k in w], float)
    d = s - np.array([uni[k] for k in w], float)
    ci = t_interval(s)
    est, lo, hi = hodges_lehmann(d) if len(w) else (None, None, None)
    finite = lambda x: None if x is None or not np.isfinite(x) else float(x)
    return dict(n=len(w), mean=float(s.mean()) if len(w) else None, ci=ci,
                ppl_ci=tuple(float(np.expm1(c)) if c is not None else None for c in ci),
                diff=finite(est), diff_ci=(finite(lo), finite(hi)))


def lowrank_perplexity(*, n: int = 512, windows: int = 8, cont: int = 64, budgets=(0.25, 0.5), window: int = 32,
                       model: str = "smollm2", device: str = "cpu") -> list[dict]:
    """Per budget: {"budget", "rank", "memory_fraction", "delta_nll", "ci": (lo, hi), "n_windows",
    "uniform_delta_nll", "diff_vs_uniform", "diff_ci", "model"}; delta = NLL(method) - NLL(exact) per token, ``ci``
    a t interval over the windows (:func:`window_effects`), at least 8 windows by default."""
    from ._trial import trial_model
    lm = trial_model(model, device)
    rows = [dict(r, window=w) for w in range(windows)
            for r in window_rows(lm, w, n=n, cont=cont, budgets=budgets, window=window)]
    out = []
    for b in budgets:
        pick = lambda m: {r["window"]: r["delta_nll"] for r in rows if r["method"] == m and r["budget"] == float(b)}
        e = window_effects(pick("subspace"), pick("uniform"))
        sub = [r for r in rows if r["method"] == "subspace" and r["budget"] == float(b)]
        out.append(dict(budget=float(b), rank=sub[0]["rank"], memory_fraction=float(np.mean([r["memory_fraction"]
                        for r in sub])), delta_nll=e["mean"], ci=e["ci"], n_windows=e["n"],
                        uniform_delta_nll=float(np.mean(list(pick("uniform").values()))), diff_vs_uniform=e["diff"],
                        diff_ci=e["diff_ci"], model=lm.name))
    return out
