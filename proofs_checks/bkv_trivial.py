"""BKV.vs-uniform against the battery of controls (:mod:`kvbounds.battery`; the rule is in :mod:`kvbounds.battery`).

The single-layer experiment of BalanceKV-NeurIPS Sec. 4.1 measures the relative error ||z_j - Attn_j|| / ||Attn_j||
of the last ``window`` queries. On that metric the trivial controls are:
  * ``zeros``        relative error exactly 1 (by definition; not computed);
  * ``mean``           z_j = the mean of the values v_0..v_j (keys ignored, O(d) memory; the whole prefix when the
                       trace is not causal), recorded as ``error mean_values`` by BKV.vs-uniform;
  * ``streaming_llm``  StreamingLLM at the same memory (the first ``sink`` and the most recent tokens), recorded as
                       ``error streaming_llm``;
  * ``uniform``        uniform sampling at equal memory with the same sink and window (the claim's own comparison,
                       its reproduction), per seed;
  * ``ablation``       the variant with random signs and the same cut (bkv_variants.ABLATIONS), per seed.

Pairs: a BalanceKV variant's error at each (layer, T) cell and seed of its compression randomness (``per_seed``,
recorded with the trivial controls; older records have no pairs and the summary says so) against each control's error on the
same cell; one setting per (trace family, variant). The trace is one text, so this is power over the method's
randomness on these layers, not over independent texts; the summary says so.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.battery import TrivialPower, power_vs_controls

from .common import make_record

__all__ = ["CONTROL_CHECKS", "CAVEAT", "UNIT", "mean_values_error", "family", "trivial_power"]

CONTROL_CHECKS = {"mean": "error mean_values", "streaming_llm": "error streaming_llm"}
CAVEAT = ("pairs = (layer, T) cell x seed of the method's randomness on one text: power over the method's "
          "randomness, not over independent texts; zeros = relative error 1 by definition")
UNIT = "seeds x (layer, T) cells of one text"


def mean_values_error(V, exact, qpos, causal: bool) -> float:
    """Mean over heads and queries of ||mean(v_0..v_j) - Attn_j|| / ||Attn_j||: V (H, n, e), exact (H, w, e)."""
    if causal:
        z = np.cumsum(V, axis=1)[:, qpos] / (np.asarray(qpos) + 1.0)[None, :, None]
    else:
        z = np.broadcast_to(V.mean(axis=1, keepdims=True), exact.shape)
    return float(np.mean(np.linalg.norm(z - exact, axis=-1) / np.linalg.norm(exact, axis=-1)))


def family(r) -> str:
    if r.extra.get("fallback"):
        return "synthetic (model missing)"
    model = str(r.extra.get("model", ""))
    return "real SmolLM2" if "smollm2" in model.lower() else "real MiniLM" if "minilm" in model.lower() else model


def trivial_power(claim: str, records, variants: dict[str, str], ablations: dict[str, str] | None = None) \
        -> TrivialPower | None:
    """The calls of :mod:`kvbounds.battery` for each variant (``{method: label}``) against the battery: zeros
    (relative error 1), the mean of the values and StreamingLLM (the method's sink and the most recent tokens) of
    the same cell, and per seed uniform sampling at equal memory (the claim's own comparison, the same sink and
    window) and the variant's ablation (``ablations[method]``: random signs, the same cut; per seed). Every method
    holds the same kept tokens (the cell's budget); the floats record budget / n. None when the records carry no
    per-seed errors (stored before the trivial controls were recorded)."""
    cell = lambda r: (r.params.get("trace"), r.params.get("T"), r.params.get("b"))
    ctl = {name: {cell(r): r.measured for r in records if r.check == check} for name, check in CONTROL_CHECKS.items()}
    seeded = {m: {cell(r): r.extra["per_seed"] for r in records if r.check == f"error {m}" and "per_seed" in r.extra}
              for m in {"uniform", *(ablations or {}).values()}}
    pairs = []
    for method, label in variants.items():
        abl = (ablations or {}).get(method)
        for r in records:
            if r.check != f"error {method}" or "per_seed" not in r.extra:
                continue
            controls = {"zeros": 1.0}
            controls.update({n: c[cell(r)] for n, c in ctl.items() if cell(r) in c})
            missing = {n: "not recorded for this cell" for n in ctl if cell(r) not in ctl[n]}
            n_tok = r.extra.get("n") or 0
            frac = r.extra["budget"] / n_tok if n_tok and r.extra.get("budget") else None
            for i, e in enumerate(r.extra["per_seed"]):
                per = dict(controls)
                for name, m in (("uniform", "uniform"), ("ablation", abl)):
                    xs = seeded.get(m, {}).get(cell(r)) if m else None
                    if xs is not None and i < len(xs):
                        per[name] = float(xs[i])
                extra = dict(controls=per, controls_missing=missing, setting=f"{family(r)} | {label}")
                if frac is not None:
                    extra["floats"] = dict(method=r.extra["budget"], stream=n_tok, fraction=frac, controls={})
                pairs.append(make_record(claim, dict(r.params, seed_index=i), measured=float(e), bound=math.nan,
                                         holds=True, bound_kind="shape", check="trivial controls", **extra))
    if not pairs:
        return None
    return power_vs_controls(pairs, setting=lambda r: r.extra["setting"], metric="relative error", unit=UNIT)
