"""SG.e2e: on LongEval-style line retrieval at equal memory, greedy k-center / ClusterGen keeps the answer better
than the other methods.

Source: "SubGen: Token Generation in Sublinear Time and Memory" (arXiv:2402.06082), Table 1, and "ClusterGen:
Token Generation in Sublinear Time and Memory with Clustering KV Cache" (anonymous conference submission),
Table 2 (greedy k-center beats Sink/H2O/uniform at the same memory on line retrieval).
Here, through :mod:`kvbounds.e2e` on SmolLM2-135M-Instruct (CPU): lines "line <name>: REGISTER_CONTENT is
<number>" generated offline, one asked at the end; the teacher-forced log-likelihood of the number (graded) and
exact match. Variants: ``kcenter`` (weights 1, what the papers keep), ``kcenter_sized`` (cluster sizes as
weights) and ``subgen`` (SubGen's split estimator, redrawn 5 times). Cells: every other method present (ours,
H2O - the papers' baseline, arXiv:2306.14048 - and kvpress's) x budget x setting, every method within 1% of
the same floats; :func:`kvbounds.verdict.reproduction_status` (test-type) with one-sided paired t-tests over
instances, Holm-adjusted over the cells, a cell counting with >= 8 instances (and most of >= 5 redraws for
SubGen); a miss is ``not-reproduced`` only when powered, else ``not-shown``. Power: the controls of
:func:`kvbounds.e2e._checks.controls` (null: an independent uniform draw is not better than uniform, judged in one
Holm family with the cells it guards; sensitivity: uniform with fewer floats is worse), as in BKV.e2e.
Settings: the question after the compressed prompt and the papers' setting (question inside it, its last window
exact; BalanceKV blocks of 128): full and quick run both from one prefill per instance (quick while
:data:`kvbounds.e2e._checks.QUICK_PAPERS_SETTING` is on, the default); every cell names its setting. quick runs
``QUICK_METHODS`` (the variants, the papers' baselines, kvpress's SnapKV / PyramidKV).
"""
from __future__ import annotations

from kvbounds import methods
from kvbounds import e2e as C

__all__ = ["CLAIM", "SOURCE", "VARIANTS", "OTHERS", "REDRAW", "QUICK_METHODS", "trials", "run_trial", "summarize"]

CLAIM = "SG.e2e"
SOURCE = "SubGen (arXiv:2402.06082) Table 1; ClusterGen (anonymous submission) Table 2"
VARIANTS = methods.variants("SubGen/ClusterGen")   # k-center (weights 1, cluster sizes) and SubGen: the registry's
OTHERS = ("uniform", "streaming_llm", "h2o", "balancekv", "kvpress:snapkv", "kvpress:pyramidkv", "kvpress:tova",
          "kvpress:knorm", "kvpress:expected_attention", "kvpress:streaming_llm", "kvpress:random")
# quick: the variants, the papers' baselines (uniform, Sink, H2O), kvpress's SnapKV / PyramidKV, BalanceKV's
# pseudocode (one draw) and the null control; full runs every method
REDRAW = tuple(m for m in VARIANTS.values() if methods.get_method(m).randomized)    # SubGen
QUICK_METHODS = tuple(VARIANTS.values()) + ("uniform",) + methods.names(role="control") + (
    "streaming_llm", "h2o", "balancekv", "kvpress:snapkv", "kvpress:pyramidkv")


def trials(profile: str) -> list[dict]:
    """smoke / quick: the claim's own trials at 512 tokens (SmolLM2) and, in quick, the curves' small cell; full: the
    score-vs-memory curves of line retrieval (Qwen2.5-Coder-0.5B at 2048 tokens, :mod:`kvbounds.e2e.curve_grid`),
    which the verdict then reads."""
    from kvbounds.e2e import curve_grid
    curves = curve_grid.trials(profile, ("lines",))
    if profile == "full":
        return curves
    return C.claim_trials(profile, {"smoke": {"lines": (256, 1)}, "quick": {"lines": (512, 8)}},
                          smoke_methods=("uniform", VARIANTS["kcenter"], VARIANTS["subgen"]), redraw=REDRAW,
                          quick_methods=QUICK_METHODS) + curves


def run_trial(params: dict, seed: int, backend: str):
    return C.run_cell_trial(CLAIM, SOURCE, params, seed)


def summarize(records):
    from kvbounds.e2e.curve_grid import claim_records
    own = claim_records(records)
    present = {r.extra.get("method") for r in own if "ll" in r.extra}
    v = C.reproduction_verdict(CLAIM, own, VARIANTS, [m for m in OTHERS if m in present], ("lines",),
                               missing_method=False)
    C.add_curves(v, records)
    return v
