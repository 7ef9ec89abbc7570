"""BKV.decode: BalanceKV's per-step guarantee where it is meant to hold, while a real model generates
(BalanceKV-NeurIPS Thm 3.1, Alg. 1).

SmolLM2 generates greedily with :class:`kvbounds.streaming.StreamingBalanceKVPress` (merge-and-reduce over weighted
coresets, every layer kept at ``target`` tokens, reduced every ``interval``). At checkpoints, each layer's output
from the streaming cache against exact attention over the layer's whole history at the current query, in the
theorem's units ``||z_j - Attn|| / (||softmax(K_j q_j / sqrt d)||_2 ||V_j||_F)`` (:mod:`proofs_checks.decode_stream`).

Scale: Thm 3.1 gives eps = O~(sqrt(d) e^{2 r^2 / sqrt d} / t) with memory t log2(n / t) (Thm 3.4); at a fixed
memory M of compressed tokens that is eps ~ sqrt(d) e^{2 r^2/sqrt d} log2(n / M) / M (a shape: constant fitted, polylogs
in it), r the largest key or query norm of the layer. Records and verdict: :mod:`proofs_checks.decode_verdict`.
"""
from __future__ import annotations

import math

from .decode_stream import run_generation, trials  # noqa: F401 - the check's trials
from .decode_verdict import build_records, summarize as _summarize
from .decode_verdict import decode_rows as leaderboard_rows  # noqa: F401 - its leaderboard table

CLAIM = "BKV.decode"
SOURCE = "BalanceKV-NeurIPS Thm 3.1, Alg. 1 (streaming, inside generation)"
SCALE = "sqrt(d) e^{2r^2/sqrt d} log2(n/M) / M"


def run_trial(params: dict, seed: int, backend: str):
    from kvbounds.streaming import StreamingBalanceKVPress
    rows, press = run_generation(StreamingBalanceKVPress, params, seed)
    M = press.middle

    def log_scale(row, h):
        d = row["d"]
        return 0.5 * math.log(d) + 2 * h["r"] ** 2 / math.sqrt(d) + math.log(max(1.0, math.log2(row["n"] / M)) / M)

    cert = press.walk_sums
    return build_records(CLAIM, SOURCE, params, rows, "F", log_scale, middle=M, reductions=press.reductions,
                         halvings=cert.halvings if cert else 0, uncertified=cert.uncertified if cert else 0)


def summarize(records):
    return _summarize(CLAIM, records, scale_text=SCALE,
                      certificate_kind="a bound from the press's state: each halving's walk discrepancy by "
                                       "Cauchy-Schwarz, e^{||q||^2/(2 sqrt d)} (X_num + ||o_hat|| X_den) / Z_lo, "
                                       "capped by ||o_hat|| + max||v||")
