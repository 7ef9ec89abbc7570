"""A record's inputs in words, as the report, the markdown report and the terminal show them: a counterexample or a
smallest input reads "n = 2, d = 2, ℓ = 3 (seed 0, numpy): measured 1 against the bound 0.974 ...", not as JSON; a
parameter's internal value ("proof001") reads as what it is; an infinite ratio in a power table says why.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np
from kvbounds.claims import cite
from kvbounds.claims import CLAIMS, cite

# parameter names as a reader writes them
SYMBOLS = {"eps": "ε", "delta": "δ", "ell": "ℓ", "l": "ℓ", "lam": "λ", "r_v": "r_V", "eps_sqrt_n": "ε√n",
           "M_over_n": "M/n", "rule": "erase rule", "block_size": "batch size"}
# internal values of a parameter, in words
VALUES = {("rule", "proof001"): "the proof's threshold (BalanceKV-NeurIPS A.1)", ("rule", "alg1"): "Alg. 1's threshold",
          ("rule", "proof"): "the proof's threshold (BalanceKV-NeurIPS A.1)"}
HIDDEN = {"sweep", "rep"}            # bookkeeping of the runner: which sweep or repetition, not an input
FIRST = ("n", "d", "s", "t", "T", "m", "r", "eps", "delta")
RECORD_FIELDS = {"seed", "backend", "measured", "bound", "ratio", "bound_kind", "check", "reading", "violations",
                 "decisive_trials", "source", "holds", "control", "trials", "time_s", "extra", "claim"}


def check_text(value: Any, name: str = "the text") -> str:
    """``value`` if it is a string, else an InputError naming ``name`` (the report's words read strings only)."""
    if not isinstance(value, str):
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"{name} is {value!r} ({type(value).__name__}), not a string")
    return value


def _check_dict(x: Any, name: str) -> None:
    if not isinstance(x, dict):
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"{name} is {str(x)[:60]!r} ({type(x).__name__}), not a dict")


def check_verdict(v: Any, name: str = "the verdict") -> Any:
    """``v`` if it is a :class:`kvbounds.verdict.Verdict`, else an InputError naming ``name``."""
    from kvbounds.verdict import Verdict
    if not isinstance(v, Verdict):
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"{name} is {str(v)[:60]!r} ({type(v).__name__}), not a Verdict (build_verdicts or "
                         f"summary_read.verdicts_from_summary make them)")
    return v


def check_verdicts(verdicts: Any) -> dict:
    """``verdicts`` if it is a dict of claim id -> Verdict, else an InputError naming the entry that is not."""
    if not isinstance(verdicts, dict):
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"verdicts is {str(verdicts)[:60]!r} ({type(verdicts).__name__}), not a dict of claim id "
                         f"-> Verdict")
    for cid, v in verdicts.items():
        check_text(cid, "a claim id of the verdicts")
        check_verdict(v, f"verdicts[{cid!r}]")
    return verdicts


def number(x: Any) -> str:
    """An int as it is, a float to 4 significant digits, ±inf as ∞ (the caller says why), NaN as "not a number"."""
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_, int, float)):
        x = int(x) if isinstance(x, numbers.Integral) else float(x)     # numpy's scalars (float32, int64) as Python's
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        if isinstance(x, str) and x in ("inf", "-inf", "nan"):      # non-finite floats as JSON stores them
            return number(float(x))
        return str(x)
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "not a number"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.4g}"


def value_in_words(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(value_in_words(key, v) for v in value) + ")"
    if isinstance(value, str):
        return VALUES.get((key, value), value)
    return number(value)


def params_in_words(params: dict) -> str:
    """"n = 2, d = 2, ℓ = 3, kind = diag": the size parameters first, the runner's bookkeeping left out."""
    _check_dict(params, "params")
    rest = (k for k in params if k not in FIRST and k not in HIDDEN)
    keys = [k for k in FIRST if k in params] + sorted(rest, key=str)
    return ", ".join(f"{SYMBOLS.get(k, k)} = {value_in_words(k, params[k])}" for k in keys)


def counterexample_in_words(cx: dict) -> str:
    """The verdict's counterexample (params, seed, backend, measured, bound, ratio, ...) as one sentence."""
    if not cx:
        return ""
    _check_dict(cx, "the counterexample")
    params = cx.get("params") if isinstance(cx.get("params"), dict) else {
        k: v for k, v in cx.items() if k not in RECORD_FIELDS}
    text = params_in_words(params) or "no parameters"
    run = ", ".join(x for x in (f"seed {cx['seed']}" if "seed" in cx else "", cx.get("backend", "")) if x)
    if run:
        text += f" ({run})"
    if "measured" in cx and "bound" in cx:
        measured = number(cx["measured"])
        if measured in ("∞", "-∞", "not a number"):
            measured += " (the computation gave no finite number)"
        text += f": measured {measured} against the bound {number(cx['bound'])}"
        details = [x for x in (cx.get("bound_kind", ""),
                               f"ratio {number(cx['ratio'])}" if "ratio" in cx and number(cx["ratio"]) != "∞" else "")
                   if x]
        if details:
            text += f" ({'; '.join(details)})"
    if cx.get("check"):
        text += f", sub-check “{cx['check']}”"
    if cx.get("reading"):
        text += f", the O(.) read as {cx['reading']}"
    if "violations" in cx and "decisive_trials" in cx:
        text += f"; {cx['violations']} of {cx['decisive_trials']} decisive trials violate the bound"
    return text


def spread_words(spread) -> str:
    """A fitted constant's spread (5th percentile, median of measured / shape over the sweep) in words, or ""."""
    if not spread:
        return ""
    if not (isinstance(spread, (list, tuple)) and len(spread) == 2):
        from kvbounds.algorithms.validation import InputError
        raise InputError(f"the spread is {spread!r}, not (5th percentile, median)")
    lo, mid = spread
    return f"measured / shape over the sweep: 5th percentile {number(lo)}, median {number(mid)}"


def infinite_ratios(table: Sequence[dict], labels: dict[str, str] | None = None) -> list[str]:
    """Why a power table shows an infinite ratio method / control: per setting where it does, the control whose
    error is 0 there, so that dividing by it gives ∞."""
    out = []
    for c in table or ():
        ratio, ci = c.get("ratio"), c.get("ratio_ci") or ()
        if not any(isinstance(x, float) and math.isinf(x) for x in (ratio, *ci)):
            continue
        zero = sorted(n for n, v in (c.get("controls") or {}).items() if v is not None and v <= 1e-12) or \
            [c.get("best") or "a control"]
        names = [(labels or {}).get(n, n) for n in zero]
        who = (f"the errors of {', '.join(names[:-1])} and {names[-1]} are" if len(names) > 1
               else f"the error of {names[0]} is")
        out.append(f"{c.get('setting', '')}: ∞ because {who} 0 (to rounding) in some or most streams: at the "
                   f"method's memory such a control keeps every token, so the method does not compress there and "
                   f"its ratio to an exact control is infinite")
    return out


def verdict_in_words(v) -> str:
    """What a claim's records show, in a sentence per verdict dimension that is set (the notebooks' closing text):
    read from the verdict, so it changes when the records do."""
    check_verdict(v)
    parts = []
    statement = v.statement or ""
    fitted = v.fitted_constant.value if v.fitted_constant else (v.constant if v.constant_kind == "fitted" else None)
    if statement == "holds":
        parts.append("every trial is within the paper's bound, with its own constants")
    elif statement == "holds-fitted":
        c = f" C = {number(fitted)}" if fitted is not None else ""
        parts.append(f"every measurement is within the stated O(.) shape times a fitted constant{c} (the largest "
                     f"measured / shape; an O(.) states no constant)"
                     + (": a constant this small says the shape is far above everything measured, so the statement "
                        "tells nothing at these sizes" if fitted is not None and fitted < 1e-6 else ""))
    elif statement == "false":
        cx = counterexample_in_words(v.counterexample or {})
        parts.append("a trial exceeds the bound as stated" + (f" (smallest: {cx})" if cx else "")
                     + (f"; corrected: {cite(v.corrected)}" if v.corrected else ""))
    elif statement.startswith("vacuous") and getattr(v.vacuity, "any_norm", ""):
        parts.append(f"the bound holds, but returning zeros meets it too, whatever the norms: vacuous at any norm "
                     f"({v.vacuity.any_norm})")
    elif statement.startswith("vacuous"):
        parts.append("the bound holds, but returning zeros meets it too: vacuous at these norms")
    elif statement == "not-refuted":
        parts.append("every trial agrees with the statement, which sampling cannot refute")
    elif statement in ("not-run", "no-check"):
        parts.append("no records in this run")
    rate = {"observed": "the ratio to the stated rate does not grow over the range run (rate observed)",
            "not-reached": "the ratio to the stated rate still grows at the largest sizes run (rate not reached: "
                           "not a counterexample)",
            "false": "past the size where the stated rate should set in, the measured exponent's interval excludes "
                     "it (rate false as stated)"}.get(v.rate)
    ri = v.rate_info
    if v.rate == "not-reached" and ri is not None and ri.onset is not None and (ri.largest or 0) >= ri.onset:
        rate = (f"past the stated rate's derived onset ({ri.param}* ~ {ri.onset:.2g}) the measured curve still bends "
                f"at the largest size run ({ri.largest:g}): rate not reached, not a counterexample"
                + (f"; deciding needs {ri.param} ~ {ri.needed:.2g}" if ri.needed else ""))
    elif v.rate == "not-reached" and v.rate_info is not None and v.rate_info.onset is not None:
        rate = (f"the stated rate's onset ({v.rate_info.param}* ~ {v.rate_info.onset:.2g}) lies beyond the largest "
                f"size run ({v.rate_info.largest:g}): rate not reached, not a counterexample")
    if rate:
        parts.append(rate)
    if v.proof == "errata":
        k = len(v.errata)
        parts.append(f"{k} {'erratum' if k == 1 else 'errata'} in the proof's steps (the statement stands or falls "
                     f"apart from them)")
    if v.reproduction not in ("", "n/a"):
        parts.append({"reproduced": "the paper's experiment reproduces", "partial": "it reproduces in part",
                      "not-reproduced": "it does not reproduce, with the power to see it",
                      "not-shown": "it is not shown, too few instances to tell", "reversed": "the effect is reversed"}
                     .get(v.reproduction, f"reproduction: {v.reproduction}"))
    if v.power == "low" and v.power_note:
        parts.append(f"against the controls at equal memory: {cite(v.power_note)}")
    elif v.power == "low":
        parts.append("a negative control passes the check (low power)")
    elif v.power == "shown":
        parts.append("the check rejects its negative controls" + (" and the method beats every trivial control"
                                                                   if v.power_table else ""))
    elif v.power not in ("", "n/a"):
        parts.append(f"power: {v.power}")
    text = "; ".join(parts) or "nothing decided"
    return text[0].upper() + text[1:] + "."


def what_the_records_show(verdicts: dict, claims) -> str:
    """A markdown list, one line per claim: its source and :func:`verdict_in_words`."""
    check_verdicts(verdicts)
    lines = []
    for cid in claims:
        if cid in verdicts:
            source = cite(CLAIMS[cid].source) if cid in CLAIMS else ""
            lines.append(f"- **{cid}**" + (f" ({source})" if source else "") + f": {verdict_in_words(verdicts[cid])}")
    return "\n".join(lines)
