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
Power (kvbounds.e2e.checks.controls): ``uniform_control`` (uniform again, its own random stream) must not be found
better than uniform (null), and uniform at the smallest budget must be found worse than at the largest
(sensitivity, with the minimal detectable effect); either failing makes power ``low``.
"""
from __future__ import annotations

from kvbounds.e2e import checks as C

CLAIM = "BKV.e2e"
SOURCE = "BalanceKV (arXiv:2502.07861, later version) Sec. 4.2-4.3, Table 1"
VARIANTS = {"pseudocode": "balancekv", "released": "balancekv_released"}
BASELINES = ("uniform", "streaming_llm", "h2o", "kvpress:snapkv", "kvpress:pyramidkv")
TASKS = ("ppl", "passkey")

SCHEDULE_FIRST = True   # long trials (model forward passes): the runner submits them first


def trials(profile: str) -> list[dict]:
    return C.claim_trials(profile, {"smoke": {"ppl": (256, 1, 32)},
                                    "quick": {"ppl": (512, 8, 32), "passkey": (512, 8)},
                                    "full": {"ppl": (1024, 30, 128), "passkey": (1024, 30)}},
                          smoke_methods=("uniform", "balancekv", "streaming_llm"), redraw=tuple(VARIANTS.values()))


def run_trial(params: dict, seed: int, backend: str):
    return C.run_cell_trial(CLAIM, SOURCE, params, seed)


def summarize(records):
    return C.reproduction_verdict(CLAIM, records, VARIANTS, BASELINES, TASKS)
