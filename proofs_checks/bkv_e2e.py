"""BKV.e2e: end to end, at compression ~0.25, BalanceKV keeps a model's output closer to exact attention than
uniform sampling, StreamingLLM, SnapKV and PyramidKV.

Source: "Streaming Attention Approximation via Discrepancy Theory" (arXiv 2502.07861, NeurIPS 2025 version),
Sec. 4.2-4.3,
Table 1 (LongBench averages at compression ~0.25: BalanceKV above uniform, StreamingLLM, SnapKV, PyramidKV)
and the needle-in-a-haystack test. Here, through :mod:`kvbounds.e2e` on SmolLM2-135M-Instruct (CPU):
perplexity of held-out continuations of real text and passkey retrieval (teacher-forced log-likelihood of the
key's digits), every method at the same number of floats, every layer compressed after one exact prefill.
Variants: the paper's pseudocode (``balancekv``) and the authors' released walk (``balancekv_released``, when
that module is present). Baselines: our uniform sampling and StreamingLLM, kvpress's SnapKV and PyramidKV
(rows skipped with a note when kvpress is missing). Per variant and setup, ``reproduction`` follows
:func:`kvbounds.verdict.reproduction_status` over cells (baseline x budget x task), a cell counting when a
one-sided paired t-test (per token for perplexity, per instance for passkey) is significant at 0.05 after a Holm adjustment over the cells.
"""
from __future__ import annotations

from kvbounds.e2e import checks as C
from kvbounds.verdict import (HOLDS, INCONCLUSIVE, NOT_RUN, Reproduction, Verdict, combine_reproductions,
                              reproduction_status, significant_cells, statement_from_reproduction)


CLAIM = "BKV.e2e"
SOURCE = "BalanceKV (arXiv:2502.07861, later version) Sec. 4.2-4.3, Table 1"
VARIANTS = {"pseudocode": "balancekv", "released": "balancekv_released"}
BASELINES = ("uniform", "streaming_llm", "kvpress:snapkv", "kvpress:pyramidkv")
TASKS = ("ppl", "passkey")

SCHEDULE_FIRST = True   # long trials (model forward passes): the runner submits them first


def trials(profile: str) -> list[dict]:
    return C.claim_trials(profile, {"smoke": {"ppl": (256, 1, 32)},
                                    "quick": {"ppl": (512, 3, 64), "passkey": (512, 3)},
                                    "full": {"ppl": (1024, 8, 128), "passkey": (1024, 10)}},
                          smoke_methods=("uniform", "balancekv", "streaming_llm"))


def run_trial(params: dict, seed: int, backend: str):
    return C.run_cell_trial(CLAIM, SOURCE, params, seed)


def compare(records, variants=VARIANTS, baselines=BASELINES, tasks=TASKS):
    """Per variant: (better, worse, cells, details) over baseline x budget x task (one-sided paired tests,
    Holm-adjusted over the cells)."""
    budgets = sorted({float(r.extra["budget"]) for r in records if r.extra.get("budget") not in (None, 1.0)
                      and "ll" in r.extra})
    out = {}
    for variant, method in variants.items():
        p_better, p_worse, details = [], [], []
        for b in budgets:
            for base in baselines:
                for task in tasks:
                    c = C.paired_compare(records, method, base, b, task)
                    if c is None:
                        continue
                    p_better.append(c["p_better"])
                    p_worse.append(c["p_worse"])
                    details.append(f"{task}@{b:g} vs {base}: {c['mean']:+.3g} nats (n={c['n']}, "
                                   f"p>={c['p_better']:.2g}, p<={c['p_worse']:.2g})")
        # the shared multiple-testing rule: each direction Holm-adjusted over the variant's cells
        better, worse = significant_cells(p_better, p_worse, C.ALPHA)
        out[variant] = (better, worse, len(p_better), details)
    return out


def summarize(records) -> Verdict:
    figs: list = []        # the quality-vs-memory figure is drawn from the leaderboard (kvbounds.e2e.leaderboard)
    if not records:
        return Verdict(CLAIM, NOT_RUN, "no records", figures=figs)
    skipped = C.skipped_notes(records)
    if all(r.check == "unavailable" for r in records):
        return Verdict(CLAIM, NOT_RUN, "; ".join(skipped), figures=figs, n_records=len(records))
    setup = C.setup_line(records)
    reps, parts = [], [setup]
    for variant, (better, worse, cells, details) in compare(records).items():
        status = reproduction_status(better, worse, cells)
        detail = (f"{better}/{cells} cells significantly better, {worse} significantly worse; " + "; ".join(details)
                  if cells else f"not run (method {VARIANTS[variant]!r} has no records)")
        reps.append(Reproduction(variant, status, setup, detail))
        parts.append(f"{variant}: {status} ({better}/{cells} better, {worse} worse)")
    main = combine_reproductions(reps)
    parts += skipped[:3]
    return Verdict(CLAIM, HOLDS if main == "reproduced" else INCONCLUSIVE, "; ".join(parts), figures=figs,
                   n_records=len(records), kind="empirical", statement=statement_from_reproduction(main),
                   reproduction=main, reproductions=reps)
