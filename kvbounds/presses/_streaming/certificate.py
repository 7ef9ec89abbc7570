"""The streaming presses' live error bars: what a number on ``||o_hat - o||_2`` means, and where it says nothing.

An :class:`ErrorBar` is returned per (row, query head) at one query: ``kind`` says whether it is a *bound* (it
holds for every input, given the press's state: coverage 100% by proof) or an *estimate* (a statistical error bar
whose coverage is measured, not proven); ``value`` is the bar (``log_value`` its natural log, kept so that a bar
beyond float64's range is still a number); ``trivial`` is the bar that needs no knowledge of the compression,
``||o_hat|| + R`` with R the largest value norm the layer has seen (exact attention is a convex combination of the
values, so ``||o|| <= R``); ``vacuous`` marks the heads where the bar is no smaller than that; ``reason`` says what
the bar is and, where it is vacuous, why.

What each press computes (o over the layer's whole history, o_hat over the cache; the cache is the exact sink and
recent tokens E plus the compressed middle M; with y_j = e^{l_j} (v_j - o_hat), exactly
o_hat - o = (Y_hat_M - Y_M) / Z, the middle's compression error of sum y over the true denominator Z):

* BalanceKV, bound: the walk's own Cauchy-Schwarz sums (:class:`~kvbounds.presses._streaming.balance.WalkSums`) at the
  query, (e^{||q||^2 s / 2} (X_num + ||o_hat|| X_den)) / Z_lo, Z_lo = max(Z_hat - e^{||q||^2 s / 2} X_den, Z_E) a
  lower bound of Z, capped by the trivial bar. Valid, and vacuous on real keys: a bound on the dropped tokens'
  logits from what the press keeps is e^{s ||q|| ||k - k'||}-loose (SmolLM2: s ||q|| ||k - k'|| ~ 17 where the
  logits differ by ~1.3), so no bound from the press's state gets near the error.
* BalanceKV, estimate: 3 max(se_HT, se_CS) / Z_hat over the middle's kept tokens i (weight w_i, y_i per unit
  weight): se_HT^2 = sum w_i (w_i - 1) ||y_i||^2 (the variance had each token been kept independently with
  probability 1 / w_i), se_CS^2 = sum over neighbours (1/2) max(w_i, w_i+1)^2 ||y_i - y_i+1||^2 (the
  collapsed-strata variance: the walk keeps one token of each pair, neighbours stand for the pair it dropped).
* SubGen, estimate: 3 (se_num + R se_den) / Z_hat, the sample standard errors of its l2 value samples and of its
  per-cluster samples (:meth:`~kvbounds.presses._streaming.subgen.SubGenState.standard_errors`). SubGen, bound: the
  trivial
  bar (its state holds no bound of its own).

Measured on the decode checks' quick runs (BKV.decode / SG.decode: SmolLM2, 810 (checkpoint, layer, head) cells
each): BalanceKV's bound covers 810/810 at a median 119 x the error (vacuous in all); its estimate covers 788/810
at a median 4.8 x; SubGen's estimate covers 717/810 at a median 5.8 x (four other prompts: BalanceKV's estimate
90-98%, SubGen's 86-99%). The estimates miss where a dropped token carried a large share of a head's attention (a
second attention sink just after the kept sink), which no bar built from the kept tokens can see.
"""
from __future__ import annotations

import dataclasses
import math

import torch

KINDS = ("bound", "estimate")


@dataclasses.dataclass(frozen=True)
class ErrorBar:
    """An error bar on the compressed attention output at one query (module docstring). ``log_value`` and
    ``trivial`` are (b, H) float64 tensors (rows, query heads)."""
    kind: str
    log_value: torch.Tensor
    trivial: torch.Tensor
    reason: str

    def __post_init__(self):
        if self.kind not in KINDS:
            from kvbounds.algorithms.validation import InputError
            raise InputError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def value(self) -> torch.Tensor:
        """The bar itself (b, H) float64 (``inf`` only where ``log_value`` exceeds float64's range)."""
        return torch.exp(self.log_value)

    @property
    def vacuous(self) -> torch.Tensor:
        """(b, H) bool: the bar is no smaller than the trivial one (it says nothing the values alone do not)."""
        return (self.log_value >= torch.log(self.trivial) - 1e-12) & (self.log_value > -math.inf)

    def __str__(self) -> str:
        v = self.value
        vac = int(self.vacuous.sum())
        return (f"{self.kind}: median {float(v.median()):.3g} over {v.numel()} heads (trivial bar median "
                f"{float(self.trivial.median()):.3g}; vacuous at {vac}/{v.numel()})")


def trivial_bar(out: torch.Tensor, vmax: torch.Tensor) -> torch.Tensor:
    """||o_hat|| + R per (row, query head): ``out`` (b, H, e) the cache's output, ``vmax`` (b, H) the largest value
    norm the layer has seen (stored or absorbed)."""
    return out.norm(dim=-1) + vmax


def capped(kind: str, log_bar: torch.Tensor, trivial: torch.Tensor, what: str, why_vacuous: str,
           empty: torch.Tensor | None = None) -> ErrorBar:
    """An ErrorBar at min(bar, trivial) for a bound (the trivial bar is itself a bound); an estimate is reported as
    computed. ``what`` says what the bar is, ``why_vacuous`` why it can be vacuous; ``empty`` (b, H) marks heads of
    rows that hold only padding (no attention output: bar 0)."""
    log_triv = torch.log(trivial)
    log_bar = torch.nan_to_num(log_bar, nan=math.inf)
    if kind == "bound":
        log_bar = torch.minimum(log_bar, log_triv)
    if empty is not None:
        log_bar = log_bar.masked_fill(empty, -math.inf)
    vac = int(((log_bar >= log_triv - 1e-12) & (log_bar > -math.inf)).sum())
    reason = what + (f"; vacuous at {vac}/{log_bar.numel()} heads ({why_vacuous})" if vac else "")
    return ErrorBar(kind, log_bar, trivial, reason)
