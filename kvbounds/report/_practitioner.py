"""Should I use it? One row per (method of the papers, task, budget) from the end-to-end records (the leaderboard's
rows, :mod:`kvbounds.e2e.leaderboard`) and the decode-time checks, against exact attention and the better of the two
standard baselines there (StreamingLLM or uniform sampling), with a call and the compression time per token beside
the prefill's.

The call is the one rule's (:func:`kvbounds.verdict.paired_calls`): paired per instance (the unit: a distinct
prompt or text window; a randomised method's redraws averaged within it by the leaderboard), the signed-rank test on
the differences for scores where a ratio means nothing (log-likelihood, exact match, NLL increase; each metric's
scale and practical threshold from :func:`kvbounds.verdict.rule_for`), Holm over every comparison of the table;
better / leaning better / tied / leaning worse / worse / not attainable. For decode error, the decode claim's own
call on the practitioner's metric (the same rule, in the claim's verdict). Budgets: 25% and 50% of the cache; a
(method, budget) not run on this profile is listed in words, never left out silently. Only the
question-after-the-prompt setting is tabled (the papers' setting is in the leaderboard).
"""
from __future__ import annotations

import math
import re
from collections import Counter, defaultdict

BUDGETS = (0.25, 0.5)
STANDARD = {"streaming_llm": "StreamingLLM", "uniform": "uniform"}
DECODE_CONTROLS = {"StreamingLLM": ("streaming_llm", "recent"), "uniform": ("uniform",)}
TASKS = {"ppl: NLL increase vs exact (nats/token)": "perplexity: NLL increase vs exact (nats/token)",
         "passkey: exact match": "passkey: exact match",
         "passkey: answer log-likelihood (nats)": "passkey: answer log-likelihood (nats)",
         "lines: exact match": "lines: exact match", "lines: answer log-likelihood (nats)": "lines: answer log-likelihood (nats)"}
LOWER_IS_BETTER = ("NLL increase", "perplexity", "decode")


def _num(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _value(r: dict | None) -> dict | None:
    if r is None or _num(r.get("value")) is None:
        return None
    return {"value": _num(r["value"]), "ci": [_num(r.get("ci_low")), _num(r.get("ci_high"))], "n": r.get("n", 0)}


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_value(v: dict | None, name: str = "the value") -> None:
    """A value dict as :func:`fmt` reads it: None, or {"value": a finite number, "ci": [low,
    high] of finite numbers or None}; anything else is an InputError naming ``name`` and the field."""
    from kvbounds.algorithms.validation import InputError
    if v is None:
        return
    if not isinstance(v, dict) or not _real(v.get("value")):
        got = v.get("value") if isinstance(v, dict) else v
        what = "value" if isinstance(v, dict) else "the value dict"
        raise InputError(f"{name}: {what} is {got!r}, not a finite number")
    ci = v.get("ci")
    if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(x is None or _real(x) for x in ci)):
        raise InputError(f"{name}: ci is {ci!r}, not [low, high] of finite numbers or None")


def fmt(v: dict | None) -> str:
    """"0.227 [0.05, 0.404]" of a value dict; "-" for none."""
    if not v:
        return "-"
    check_value(v)
    lo, hi = v["ci"]
    return f"{v['value']:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else "")


def _units(r: dict | None) -> dict:
    u = (r or {}).get("units") or {}
    return {str(k): float(v) for k, v in u.items() if _num(v) is not None}


def comparison(method_row: dict | None, base_row: dict | None, metric: str, where: str, base_name: str):
    """The one rule's comparison of a method's leaderboard row with a baseline's over their shared instances (the
    rows' ``units``: instance -> score); ``reason`` says why not when they share none."""
    from kvbounds.verdict import Comparison, rule_for
    scale, lower, thr, bounded = rule_for(metric)
    a, b = _units(method_row), _units(base_row)
    keys = sorted(set(a) & set(b))
    reason = "" if keys else ("no per-instance scores in these rows" if not (a and b) else "no shared instance")
    return Comparison(where, base_name, [a[k] for k in keys], [b[k] for k in keys], reason=reason, scale=scale,
                      lower_is_better=lower, threshold=thr, bounded=bounded)


def _best(cands: list[tuple[str, dict]], lower_better: bool) -> tuple[str, dict] | None:
    cands = [c for c in cands if c[1]]
    if not cands:
        return None
    return min(cands, key=lambda c: (c[1]["value"] if lower_better else -c[1]["value"], c[0]))


def _decode_claim(method: str, verdicts: dict) -> str:
    from kvbounds import claims as registry
    for cid, c in registry.CLAIMS.items():
        if c.variant.endswith(":streaming") and c.variant.split(":")[0].split("/")[0] in method and cid in verdicts:
            return cid
    return ""


def _paired_call(verdict, controls: tuple) -> dict | None:
    """The decode claim's call against the baseline (its practitioner's metric where it has one)."""
    from kvbounds.verdict import headline_calls
    calls = [c for c in headline_calls(getattr(verdict, "power_calls", None) or []) if c["control"] in controls]
    return calls[0] if calls else None


# a leaderboard metric -> the end-to-end claims' task whose calls are on the same score (the gain over exact attention)
CLAIM_TASKS = {"ppl: NLL increase vs exact (nats/token)": "ppl", "passkey: answer log-likelihood (nats)": "passkey",
               "lines: answer log-likelihood (nats)": "lines"}


def _claim_call(verdicts: dict, method: str, metric: str, budget: float, baseline: str) -> dict | None:
    """The end-to-end claim's own call of ``method`` against ``baseline`` on this task and budget, with the question
    after the prompt (:func:`kvbounds.e2e.checks.cell_calls`), so that the table states the claim's call; None when no
    verdict carries one (exact match, or a claim not run)."""
    task = CLAIM_TASKS.get(metric)
    for v in (verdicts or {}).values():
        for c in getattr(v, "power_calls", None) or []:
            if task and c.get("task") == task and c.get("method") == method and c.get("control") == baseline \
                    and c.get("setting", "after") == "after" and abs(float(c.get("budget", -1)) - budget) < 1e-9:
                return c
    return None


def _call_rows(rows: list[dict], comps: list) -> None:
    """Each row's call (and its comparison's dict): the one rule over every comparison of the table, one Holm
    family; a row without a baseline run is not tested."""
    from kvbounds.verdict import paired_calls
    live = [(r, c) for r, c in zip(rows, comps) if c is not None]
    calls = paired_calls([c for _, c in live], unit="an instance: a distinct prompt or text window",
                         metric="practitioner") if live else []
    for (r, _), call in zip(live, calls):
        r["call"], r["comparison"] = call.call, call.as_dict()


def method_words(name: str) -> str:
    """A registered method's variant in words (:data:`kvbounds.methods.VARIANT_WORDS`); "" for an unknown name."""
    from kvbounds.methods import get_method, variant_words
    try:
        m = get_method(name)
    except Exception:  # noqa: BLE001 - a method of older records no longer registered
        return ""
    return variant_words(m.algorithm, m.variant) if m.algorithm and m.variant else (m.label or "")


def per_token_ms(timing: list[dict]) -> dict[str, dict]:
    """method -> {"compress": ms per token, "prefill": ms per token}, averaged over the timed windows."""
    from kvbounds.algorithms.validation import InputError
    acc: dict = defaultdict(lambda: [0.0, 0.0, 0])
    for i, t in enumerate(timing or []):
        if not isinstance(t, dict) or not isinstance(t.get("method"), str):
            raise InputError(f"timing row {i}: {t!r} is not a dict with a method name")
        for key in ("n", "count"):
            if not (isinstance(t.get(key), int) and not isinstance(t.get(key), bool) and t[key] >= 0):
                raise InputError(f"timing row {i} ({t['method']}): {key} is {t.get(key)!r}, not an integer >= 0")
        for key in ("compress_s", "prefill_s"):
            if not (_real(t.get(key)) and t[key] >= 0):
                raise InputError(f"timing row {i} ({t['method']}): {key} is {t.get(key)!r}, not a finite "
                                 f"number of seconds >= 0")
        if t.get("n"):
            a = acc[t["method"]]
            a[0] += 1e3 * t["compress_s"] / t["n"] * t["count"]
            a[1] += 1e3 * t["prefill_s"] / t["n"] * t["count"]
            a[2] += t["count"]
    return {m: {"compress": a[0] / a[2], "prefill": a[1] / a[2]} for m, a in acc.items() if a[2]}


def practitioner_table(board: list[dict] | None, verdicts: dict | None = None,
                       timing: list[dict] | None = None) -> dict | None:
    """{"rows": [...], "not_run": [lines], "notes": [lines]}; None without end-to-end or decode rows. A row: method,
    variant (its words), task, budget ("25%"), value, exact, baseline (name), baseline_value, call, compress_ms,
    prefill_ms (per token; None without timing)."""
    from kvbounds.methods import leaderboard_family
    from ._rows import check_board_rows
    if not board:
        return None
    check_board_rows(board)
    verdicts = verdicts or {}
    times = per_token_ms(timing or [])
    by: dict = {}
    for r in board:
        by[(r.get("method"), r.get("metric"), _num(r.get("budget")))] = r
    rows, not_run, notes, comps = [], [], [], []
    ours = sorted({r["method"] for r in board if r.get("metric") in TASKS and
                   (r.get("family") or leaderboard_family(r["method"])) == "ours"})
    for metric, task in TASKS.items():
        lower = any(w in metric for w in LOWER_IS_BETTER)
        methods = [m for m in ours if any(by.get((m, metric, b)) for b in BUDGETS)]
        if not methods:
            collapsed = [r for r in board if r.get("metric") == metric and r.get("method") == "all methods"]
            if collapsed:
                why = re.sub(r"^no information: ", "", str(collapsed[0].get("note", "")))
                notes.append(f"{task}: no information here ({why})")
            continue
        exact = _value(by.get(("exact", metric, 1.0)))
        for b in BUDGETS:
            base = _best([(k, _value(by.get((k, metric, b)))) for k in STANDARD], lower)
            for m in methods:
                mine = _value(by.get((m, metric, b)))
                if mine is None:
                    continue
                t = times.get(m, {})
                name = STANDARD[base[0]] if base else "none run"
                claim_call = _claim_call(verdicts, m, metric, b, base[0]) if base else None
                comps.append(None if claim_call or not base else
                             comparison(by.get((m, metric, b)), by.get((base[0], metric, b)), metric,
                                        f"{m} | {task} | {100 * b:.0f}%", name))
                rows.append(dict(method=m, variant=method_words(m), task=task, budget=f"{100 * b:.0f}%", value=mine,
                                 exact=exact, baseline=name, baseline_value=base[1] if base else None,
                                 call=claim_call["call"] if claim_call else "not tested", comparison=claim_call,
                                 compress_ms=t.get("compress"), prefill_ms=t.get("prefill")))
    _call_rows(rows, comps)
    ran = {(r["method"], r["budget"]) for r in rows}
    for b in BUDGETS:
        missing = [m for m in ours if (m, f"{100 * b:.0f}%") not in ran]
        if missing and len(missing) < len(ours):
            not_run.append(f"at {100 * b:.0f}% of the cache: {', '.join(missing)} not run on this profile")
        elif missing:
            only = sorted({r["method"] for r in board if _num(r.get("budget")) == b and r.get("metric") in TASKS
                           and r["method"] not in ("exact", "all methods")})
            not_run.append(f"at {100 * b:.0f}% of the cache no method of the papers ran on this profile"
                           + (f" (only {', '.join(only)}, the baselines' sensitivity control)" if only else ""))
    own = [r["comparison"] for r in rows if r.get("comparison") and r["call"] != "not tested"
           and not r["comparison"].get("task")]
    if any(r.get("comparison") and r["comparison"].get("task") for r in rows):
        notes.append("the end-to-end calls on perplexity and answer log-likelihood are the claims' own (BKV.e2e, "
                     "SG.e2e: the one rule at the unit, an instance, on the gain over exact attention, Holm over each "
                     "variant's cells; the effect: method minus baseline in nats, negative when worse)")
    if own:
        from kvbounds.verdict import holm_family_words
        notes.append(f"the other end-to-end calls: {holm_family_words(own)} (exact match: 20 points, a tie of 0/1 "
                     f"scores an equivalence only when the share of instances that could differ is that small)")
    rows += _decode_rows(board, verdicts)
    if any(r["task"].startswith("decode") for r in rows):
        notes.append("decode error is measured at the decode check's own memory (its budget column), where exact "
                     "attention's error is 0; its call is the decode claim's own (the one rule at the unit, a "
                     "generation from a distinct prompt, on the practitioner's metric)")
    if not rows:
        return None
    return {"rows": rows, "not_run": not_run, "notes": notes, "in_words": in_words(rows)}


def in_words(rows: list[dict]) -> str:
    """The table's answer in one sentence per budget: how many (method, task) rows are better / leaning better /
    tied / leaning worse / worse / not attainable against the better standard baseline, and which methods are
    better or worse where."""
    out = []
    for budget in dict.fromkeys(r["budget"] for r in rows):
        rs = [r for r in rows if r["budget"] == budget]
        n = Counter(r["call"] for r in rs)
        where = lambda call: sorted({f"{r['method']} ({r['task'].split(':')[0]})" for r in rs if r["call"] == call})
        counts = ", ".join(f"{n[c]} {c}" for c in ("better", "leaning better", "tied", "leaning worse", "worse",
                                                   "not attainable", "not tested") if n[c])
        text = (f"At {budget} of the memory, of {len(rs)} (method, task) comparisons with the better of StreamingLLM "
                f"and uniform sampling: {counts}")
        for call in ("better", "worse"):
            if where(call):
                text += f"; {call}: {', '.join(where(call))}"
        out.append(text + ".")
    return " ".join(out)


def _decode_rows(board: list[dict], verdicts: dict) -> list[dict]:
    from kvbounds.methods import leaderboard_family
    out = []
    metrics = sorted({r["metric"] for r in board if str(r.get("metric", "")).startswith("decode:")})
    for metric in metrics:
        rs = [r for r in board if r["metric"] == metric]
        bases = [(name, _value(next((r for r in rs if r["method"].startswith("control: " + name)), None)))
                 for name in DECODE_CONTROLS]
        base = _best(bases, True)
        for r in rs:
            if (r.get("family") or leaderboard_family(r["method"])) != "ours" or r["method"].startswith("control:"):
                continue
            mine = _value(r)
            if mine is None:
                continue
            cid = _decode_claim(r["method"], verdicts)
            paired = _paired_call(verdicts[cid], DECODE_CONTROLS[base[0]]) if cid and base else None
            out.append(dict(method=r["method"], variant=cid and verdicts[cid].variant.replace("variant measured: ", ""),
                            task=metric, budget=f"{100 * _num(r['budget']):.0f}%", value=mine,
                            exact={"value": 0.0, "ci": [0.0, 0.0], "n": 0}, baseline=base[0] if base else "none run",
                            baseline_value=base[1] if base else None,
                            call=paired["call"] if paired else "not tested", comparison=paired,
                            compress_ms=None, prefill_ms=None))
    return out


def _effect_words(r: dict) -> str:
    """" (0.12 [0.05, 0.2], 8/8 wins)" of a row's comparison (the effect method vs baseline), "" without one."""
    from kvbounds.verdict import numbers
    c = r.get("comparison")
    if not c or c.get("call") == "not tested":
        return ""
    return f" ({numbers(c, family=False)})"


def markdown_lines(table: dict | None) -> list[str]:
    """The table as markdown, with the (method, budget) pairs not run and the notes below it."""
    if not table:
        return ["No end-to-end records in this run: run `make report` for the practitioner's table."]
    lines = [f"**In short**: {table['in_words']}", ""] if table.get("in_words") else []
    lines += ["| method | task | budget | method [95% CI] | exact | best baseline [95% CI] | call (effect [95% CI], "
              "units) | compress / prefill (ms per token) |", "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        ex = f"{r['exact']['value']:.3g}" if r["exact"] else "-"
        t = (f"{r['compress_ms']:.3g} / {r['prefill_ms']:.3g}" if r["compress_ms"] is not None else "not timed")
        task = r["task"].replace("|", "\\|")          # a norm's bars inside a table cell
        lines.append(f"| {r['method']} | {task} | {r['budget']} | {fmt(r['value'])} | {ex} | {r['baseline']} "
                     f"{fmt(r['baseline_value'])} | **{r['call']}**{_effect_words(r)} | {t} |")
    lines.append("")
    words = {r["method"]: r["variant"] for r in table["rows"] if r["variant"]}
    if words:
        lines.append("- Methods: " + "; ".join(f"{m}: {w}" for m, w in words.items()) + ".")
    lines += [f"- Not run: {x}." for x in table["not_run"]] + [f"- {x}." for x in table["notes"]]
    return lines + [""]
