"""BKV.vs-uniform against the battery of controls (:mod:`kvbounds.battery`; the rule is in :mod:`kvbounds.battery`).

The single-layer experiment of BalanceKV-NeurIPS Sec. 4.1 measures the relative error ||z_j - Attn_j|| / ||Attn_j||
of the last ``window`` queries (the queries that follow the compressed middle: the practitioner's metric). On that
metric the trivial controls are:
  * ``zeros``        relative error exactly 1 (by definition; not computed);
  * ``mean``           z_j = the mean of the values v_0..v_j (keys ignored, O(d) memory; the whole prefix when the
                       trace is not causal), recorded as ``error mean_values`` by BKV.vs-uniform;
  * ``streaming_llm``  StreamingLLM at the same memory (the first ``sink`` and the most recent tokens), recorded as
                       ``error streaming_llm``;
  * ``uniform``        uniform sampling at equal memory with the same sink and window (the claim's own comparison,
                       its reproduction), the mean over its seeds;
  * ``ablation``       the variant with random signs and the same cut (bkv_variants.ABLATIONS), the mean over seeds.

The unit of replication is a text (its ``extra["unit"]``): per (text, layer, T) cell the variant's error is the mean
over the seeds of its compression randomness (seeds are never units), paired with each control's on the same cell (a
deterministic control once, a randomized one averaged over its seeds too); the layers of one text are one unit (their
median). One setting per (trace family, variant, T when several).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.battery import TrivialPower, power_vs_controls, stream_unit

from .common import make_record

__all__ = ["CONTROL_CHECKS", "CAVEAT", "mean_values_error", "family", "trivial_power", "METRIC", "cell"]

CONTROL_CHECKS = {"mean": "error mean_values", "streaming_llm": "error streaming_llm"}
CAVEAT = ("the unit is a text (its layers one unit, each side the mean over its seeds); zeros = relative error 1 by "
          "definition")
METRIC = "relative error of the last window's queries (BalanceKV-NeurIPS Sec. 4.1)"


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


def cell(r) -> tuple:
    return (r.params.get("trace"), r.params.get("text"), r.params.get("T"), r.params.get("b"))


def _seed_mean(r) -> float | None:
    xs = r.extra.get("per_seed")
    return float(np.mean(xs)) if xs else None


def trivial_power(claim: str, records, variants: dict[str, str], ablations: dict[str, str] | None = None) \
        -> TrivialPower | None:
    """The one rule's calls (:func:`kvbounds.battery.power_vs_controls`, on the practitioner's metric) for each
    variant (``{method: label}``) against the battery at the unit, a text: zeros (relative error 1), the mean of the
    values and StreamingLLM of the same cell, uniform sampling at equal memory (the claim's own comparison, the same
    sink and window) and the variant's ablation (``ablations[method]``: random signs, the same cut), each randomized
    side the mean over its seeds. Every method holds the same kept tokens (the cell's budget); the floats record
    budget / n. None when the records carry no per-seed errors (stored before the trivial controls were recorded)."""
    ctl = {name: {cell(r): r.measured for r in records if r.check == check} for name, check in CONTROL_CHECKS.items()}
    seeded = {m: {cell(r): _seed_mean(r) for r in records if r.check == f"error {m}" and "per_seed" in r.extra}
              for m in {"uniform", *(ablations or {}).values()}}
    several_t = len({r.params.get("T") for r in records}) > 1
    pairs = []
    for method, label in variants.items():
        abl = (ablations or {}).get(method)
        for r in records:
            if r.check != f"error {method}" or "per_seed" not in r.extra:
                continue
            controls = {"zeros": 1.0}
            controls.update({n: c[cell(r)] for n, c in ctl.items() if cell(r) in c})
            missing = {n: "not recorded for this cell" for n in ctl if cell(r) not in ctl[n]}
            for name, m in (("uniform", "uniform"), ("ablation", abl)):
                x = seeded.get(m, {}).get(cell(r)) if m else None
                if x is not None:
                    controls[name] = x
            n_tok = r.extra.get("n") or 0
            frac = r.extra["budget"] / n_tok if n_tok and r.extra.get("budget") else None
            where = f"{family(r)} | {label}" + (f" | T={r.params.get('T')}" if several_t else "")
            extra = dict(controls=controls, controls_missing=missing, setting=where,
                         unit=r.extra.get("unit") or f"text {r.params.get('trace')}")
            if frac is not None:
                extra["floats"] = dict(method=r.extra["budget"], stream=n_tok, fraction=frac, controls={})
            pairs.append(make_record(claim, dict(r.params), measured=_seed_mean(r), bound=math.nan, holds=True,
                                     bound_kind="shape", check="trivial controls", **extra))
    if not pairs:
        return None
    return power_vs_controls(pairs, setting=lambda r: r.extra["setting"], metric=METRIC, unit="distinct texts",
                             unit_of=stream_unit, named_metric="practitioner")
