"""SUB.lowrank's perplexity falsifier through the end-to-end harness, as a function the SUB.lowrank check can call.

The subspace draft (Subspace-FD-draft) hypothesises that a layer's keys and values live near a low-rank subspace, so projecting
them costs little end to end. :func:`lowrank_perplexity` projects every layer's middle keys/values onto their
top-r subspace (:class:`kvbounds.algorithms.compressor_adapters.SubspaceCompressor`, r from the float budget;
first/last ``window`` tokens exact) and measures the held-out per-token NLL increase against exact attention on
windows of real text, with uniform sampling at the same memory as the reference.
"""
from __future__ import annotations

import numpy as np

from .leaderboard import _t_interval


def lowrank_perplexity(*, n: int = 512, windows: int = 8, cont: int = 64, budgets=(0.25, 0.5), window: int = 32,
                       model: str = "smollm2", device: str = "cpu") -> list[dict]:
    """Per budget: {"budget", "rank", "memory_fraction", "delta_nll", "ci": (lo, hi), "n_windows", "n_tokens",
    "uniform_delta_nll", "ppl_exact", "ppl_subspace", "model"}; delta = NLL(method) - NLL(exact) per token. The unit
    is the window (issue 21): ``ci`` is a t interval over the windows' mean per-token increases (the tokens of one
    window are not independent), so at least 8 windows by default."""
    from kvbounds.algorithms.compressor_adapters import SubspaceCompressor
    from . import tasks
    from .checks import _model
    from .harness import run_cell
    lm = _model(model, device)
    per: dict = {}
    exact_nll = []
    for w in range(windows):
        task = tasks.ppl_task(lm, n, cont + 1, w)
        rows = run_cell(lm, task, ["subspace", "uniform"], budgets, sink=window, window=window)
        ex = np.asarray(rows[0]["ll"])
        exact_nll.append(-ex)
        for r in rows[1:]:
            if r["error"]:
                raise RuntimeError(r["error"])
            per.setdefault((r["method"], r["budget"]), []).append((ex - np.asarray(r["ll"]), r["memory_floats"],
                                                                   rows[0]["memory_floats"]))
    out = []
    d = lm.head_dim
    for b in budgets:
        sub = per[("subspace", float(b))]
        uni = per[("uniform", float(b))]
        diff = np.concatenate([x[0] for x in sub])
        per_window = np.array([x[0].mean() for x in sub])
        left = int(b * n * 2 * d) - 2 * window * 2 * d
        out.append(dict(budget=float(b), rank=SubspaceCompressor(window, window).rank_for(n - 2 * window, d, left),
                        memory_fraction=float(np.mean([x[1] / x[2] for x in sub])), delta_nll=float(diff.mean()),
                        ci=_t_interval(per_window), n_windows=int(len(per_window)), n_tokens=int(len(diff)),
                        uniform_delta_nll=float(np.concatenate([x[0] for x in uni]).mean()),
                        ppl_exact=float(np.exp(np.concatenate(exact_nll).mean())),
                        ppl_subspace=float(np.exp(np.concatenate(exact_nll).mean() + diff.mean())), model=lm.name))
    return out
