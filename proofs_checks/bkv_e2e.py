"""BKV.e2e: end to end, at compression ~0.25, BalanceKV keeps a model's output closer to exact attention than
uniform sampling, StreamingLLM, SnapKV and PyramidKV.

Source: "Streaming Attention Approximation via Discrepancy Theory" (arXiv 2502.07861, NeurIPS 2025 version),
Sec. 4.2-4.3,
Table 1 (LongBench averages at compression ~0.25: BalanceKV above uniform, StreamingLLM, SnapKV, PyramidKV)
and the needle-in-a-haystack test. Here, through :mod:`kvbounds.e2e` on SmolLM2-135M-Instruct (CPU):
perplexity of held-out continuations of real text and passkey retrieval (teacher-forced log-likelihood of the
key's digits), every method at the same number of floats, every layer compressed after one exact prefill.
Variants: the paper's pseudocode (``balancekv``) and the authors' released walk (``balancekv_released``, when
that module is present), each redrawn 5 times. Baselines: our uniform sampling, StreamingLLM and H2O
(arXiv:2306.14048), kvpress's SnapKV and PyramidKV (rows skipped with a note when kvpress is missing; PyramidKV
equal to SnapKV on every instance counts once). Every method holds within 1% of the same floats.
Per variant, ``reproduction`` follows :func:`kvbounds.verdict.reproduction_status` (test-type) over cells
(baseline x budget x task x setting): a one-sided paired t-test over instances (a window's mean per-token
log-likelihood for perplexity, the answer's for passkey), Holm-adjusted over the variant's cells per redraw; a
cell counts with >= 8 instances when significant in most of >= 5 redraws (:mod:`kvbounds.e2e`).
A miss is ``not-reproduced`` (effect bounded) only when the cells could detect the memory effect, else
``not-shown``. Settings (passkey; perplexity has no question): the question after the compressed prompt and the
papers' setting with the question inside it and blocks of 128: full runs both (one prefill serves both:
:func:`kvbounds.e2e._harness.slice_prefill`), and so does quick (both while
:data:`kvbounds.e2e._checks.QUICK_PAPERS_SETTING` is on, the default); every cell of the verdict names its setting.
quick runs this
verdict's methods only (``QUICK_METHODS``), with 32 held-out tokens per perplexity window.
Power (kvbounds.e2e._checks.controls): ``uniform_control`` (uniform again, its own random stream) must not be found
better than uniform (null, Holm-adjusted together with the claim's cells), and uniform at 0.25 must be found worse
than at 0.5 (sensitivity, with the minimal detectable effect); either failing makes power ``low``.
"""
from __future__ import annotations

from kvbounds import methods
from kvbounds import e2e as C
from kvbounds.algorithms import walk_diagnostics as wd
from kvbounds.algorithms.equal_memory import balance_layout

__all__ = ["CLAIM", "SOURCE", "VARIANTS", "BASELINES", "TASKS", "QUICK_METHODS", "trials", "WALKS", "FIRST_LAYER",
           "LATER_LAYERS", "walk_cause_of_prefill", "run_trial", "walk_cause_text", "summarize"]

CLAIM = "BKV.e2e"
SOURCE = "BalanceKV (arXiv:2502.07861, later version) Sec. 4.2-4.3, Table 1"
VARIANTS = methods.variants("BalanceKV")     # {"pseudocode": ..., "released": ...}: the registry's BalanceKV variants
BASELINES = ("uniform", "streaming_llm", "h2o", "kvpress:snapkv", "kvpress:pyramidkv")
TASKS = ("ppl", "passkey")
# quick: what this verdict reads (the variants, the baselines, the null control); full runs every method
QUICK_METHODS = tuple(VARIANTS.values()) + ("uniform",) + methods.names(role="control") + BASELINES[1:]


def trials(profile: str) -> list[dict]:
    """smoke / quick: the claim's own trials at 512 tokens (the papers' compression, 25%) and, in quick, the curves'
    small cells; full: the score-vs-memory curves at 2048 tokens on both models (:mod:`kvbounds.e2e.curve_grid`),
    which the verdict then reads."""
    from kvbounds.e2e import curve_grid
    curves = curve_grid.trials(profile, TASKS + curve_grid.RULER)
    if profile == "full":
        return curves
    return C.claim_trials(profile, {"smoke": {"ppl": (256, 1, 32)},
                                    "quick": {"ppl": (512, 8, 32), "passkey": (512, 8)}},
                          smoke_methods=("uniform", "balancekv", "streaming_llm"), redraw=tuple(VARIANTS.values()),
                          quick_methods=QUICK_METHODS) + curves


# the kernel and sign rule of each variant's walk (kvbounds.algorithms.walk_diagnostics.KERNELS): the pseudocode at
# the model's temperature and the theorem's c, the released walk as run_longbench.py runs it (temp 1, gamma 4)
WALKS = {"balancekv": ("balance", "theorem", 0), "balancekv_released": ("released-t1", "released", 1)}
FIRST_LAYER = "layer 0"
LATER_LAYERS = "layers 1 and up"


def walk_cause_of_prefill(params: dict, lm, state) -> dict | None:
    """What each BalanceKV variant's walk has to balance on this instance's prefill: the first-level blocks of its
    own layout at each budget (:func:`kvbounds.algorithms.equal_memory.balance_layout`, the released walk with its
    weight per token), SmolLM2's first layer apart from the others, raw and with the block's keys centred
    (:func:`kvbounds.algorithms.walk_diagnostics.blockwise_walk_cause`). The first instance of each task and
    setting only (the prompt's text differs between instances, its norms do not); None for the others."""
    import zlib

    import numpy as np

    if int(params.get("index", 0)) != 0:
        return None
    K = np.stack([X[0].double().cpu().numpy() for X in state.keys])      # (layers, KV heads, n, d)
    V = np.stack([X[0].double().cpu().numpy() for X in state.values])
    n, d, sink, b = state.n, K.shape[-1], int(params["sink"]), int(params.get("block_size", 64))
    out = {}
    for method, (kernel, _, weights) in WALKS.items():
        if method not in params["methods"]:
            continue
        for budget in params["budgets"]:
            rng = np.random.default_rng([7, zlib.crc32(f"{params['task']}:{method}:{budget}:{b}".encode())])
            try:
                T, win = balance_layout(n, d, sink, int(params["window"]), int(budget * n * 2 * d), weights)
                out[(method, float(budget))] = {
                    group: wd.blockwise_walk_cause(K[sl], V[sl], block_size=b, sink=sink, window=win,
                                                   kernels=(kernel,), rng=rng)[kernel]
                    for group, sl in ((FIRST_LAYER, slice(0, 1)), (LATER_LAYERS, slice(1, None)))}
            except Exception as e:   # noqa: BLE001 - no full block in this layout: said in the record, not fatal
                out[(method, float(budget))] = {"error": str(e)[:200]}
    return out


def run_trial(params: dict, seed: int, backend: str):
    # the walk's cause is measured on the claim's own trials; the curves' (kvbounds.e2e.curve_grid) do not repeat it
    return C.run_cell_trial(CLAIM, SOURCE, params, seed,
                            measure=None if params.get("curve") else walk_cause_of_prefill)


def walk_cause_text(records) -> tuple[str, list]:
    """Per variant, setting and layer group, what its walk has to balance (the summary's clause, the card's
    finding)."""
    from . import walk_cause
    parts, findings = [], []
    for variant, method in VARIANTS.items():
        rs = [r for r in records if r.extra.get("method") == method and isinstance(r.extra.get("walk_cause"), dict)]
        causes: dict = {}
        for r in rs:
            for group, c in r.extra["walk_cause"].items():
                if isinstance(c, dict) and "raw" in c:
                    causes.setdefault(f"{C.SETTING_WORDS.get(r.extra.get('setting'), r.extra.get('setting'))}, "
                                      f"{group}", []).append(c)
        merged = {k: walk_cause.merge_sides(v) for k, v in sorted(causes.items())}
        if not merged:
            continue
        walk = WALKS.get(method, ("", "theorem"))[1]
        parts.append(f"what the {variant} walk has to balance (first-level blocks of the prefill): "
                     + walk_cause.settings_text(merged, walk=walk))
        f = walk_cause.cause_finding(CLAIM, merged, what=f"the {variant} walk ({method}) on the first-level blocks of "
                                     "each task's first prefill", walk=walk)
        findings += [f] if f else []
    return "; ".join(parts), findings


def summarize(records):
    from kvbounds.e2e.curve_grid import claim_records
    v = C.reproduction_verdict(CLAIM, claim_records(records), VARIANTS, BASELINES, TASKS)
    C.add_curves(v, records)
    text, findings = walk_cause_text(records)
    if text:
        v.summary += "; " + text
        v.findings += findings
    return v
