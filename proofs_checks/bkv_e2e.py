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
cell counts with >= 8 instances when significant in most of >= 5 redraws (:mod:`kvbounds.e2e.comparisons`).
A miss is ``not-reproduced`` (effect bounded) only when the cells could detect the memory effect, else
``not-shown``. Settings (passkey; perplexity has no question): the question after the compressed prompt and the
papers' setting with the question inside it and blocks of 128: full runs both (one prefill serves both:
:func:`kvbounds.e2e.harness.slice_prefill`), and so does quick (both while
:data:`kvbounds.e2e.checks.QUICK_PAPERS_SETTING` is on, the default); every cell of the verdict names its setting. quick runs this
verdict's methods only (``QUICK_METHODS``), with 32 held-out tokens per perplexity window.
Power (kvbounds.e2e.checks.controls): ``uniform_control`` (uniform again, its own random stream) must not be found
better than uniform (null, Holm-adjusted together with the claim's cells), and uniform at 0.25 must be found worse
than at 0.5 (sensitivity, with the minimal detectable effect); either failing makes power ``low``.
"""
from __future__ import annotations

from kvbounds import methods
from kvbounds.e2e import checks as C

CLAIM = "BKV.e2e"
SOURCE = "BalanceKV (arXiv:2502.07861, later version) Sec. 4.2-4.3, Table 1"
VARIANTS = methods.variants("BalanceKV")     # {"pseudocode": ..., "released": ...}: the registry's BalanceKV variants
BASELINES = ("uniform", "streaming_llm", "h2o", "kvpress:snapkv", "kvpress:pyramidkv")
TASKS = ("ppl", "passkey")
# quick: what this verdict reads (the variants, the baselines, the null control); full runs every method
QUICK_METHODS = tuple(VARIANTS.values()) + ("uniform",) + methods.names(role="control") + BASELINES[1:]


def trials(profile: str) -> list[dict]:
    return C.claim_trials(profile, {"smoke": {"ppl": (256, 1, 32)},
                                    "quick": {"ppl": (512, 8, 32), "passkey": (512, 8)},
                                    "full": {"ppl": (1024, 30, 128), "passkey": (1024, 30)}},
                          smoke_methods=("uniform", "balancekv", "streaming_llm"), redraw=tuple(VARIANTS.values()),
                          quick_methods=QUICK_METHODS)


def run_trial(params: dict, seed: int, backend: str):
    return C.run_cell_trial(CLAIM, SOURCE, params, seed)


def summarize(records):
    return C.reproduction_verdict(CLAIM, records, VARIANTS, BASELINES, TASKS)
