"""Should I use it? One row per (method of the papers, task, budget) from the end-to-end records (the leaderboard's
rows, :mod:`kvbounds.e2e`) and the decode-time checks, against exact attention and the better of the two
standard baselines there (StreamingLLM or uniform sampling), with a one-word call and the compression time per token
beside the prefill's.

The call: ``better`` / ``worse`` when the 95% intervals of the method and of the baseline do not overlap (a
conservative rule: non-overlapping intervals imply a difference, overlapping ones do not rule one out), else ``not
shown``; for decode error, the battery's paired call (:mod:`kvbounds.battery`, in the decode claim's verdict)
against that baseline where the verdict carries one (``tied`` only from there: the intervals alone never show a
tie). Budgets: 25% and 50% of the cache; a (method, budget) not run on this profile is listed in words, never left
out silently. Only the question-after-the-prompt setting is tabled (the papers' setting is in the leaderboard).
"""
from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from kvbounds.algorithms.validation import InputError

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
    """A value dict as :func:`fmt` and :func:`interval_call` read it: None, or {"value": a finite number, "ci": [low,
    high] of finite numbers or None}; anything else is an InputError naming ``name`` and the field."""
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


def interval_call(method: dict | None, base: dict | None, lower_better: bool) -> str:
    """better / worse when the two 95% intervals do not overlap, else not shown (module docstring)."""
    check_value(method, "the method's value")
    check_value(base, "the baseline's value")
    if not method or not base or None in method["ci"] or None in base["ci"]:
        return "not shown"
    (mlo, mhi), (blo, bhi) = method["ci"], base["ci"]
    if mhi < blo:
        return "better" if lower_better else "worse"
    if mlo > bhi:
        return "worse" if lower_better else "better"
    return "not shown"


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


def _paired_call(verdict, controls: tuple) -> str:
    calls = [c for c in (getattr(verdict, "power_calls", None) or []) if c["control"] in controls
             and c["call"] != "not tested"]
    return calls[0]["call"] if calls else ""


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
    rows, not_run, notes = [], [], []
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
            base = _best([(STANDARD[k], _value(by.get((k, metric, b)))) for k in STANDARD], lower)
            for m in methods:
                mine = _value(by.get((m, metric, b)))
                if mine is None:
                    continue
                t = times.get(m, {})
                rows.append(dict(method=m, variant=method_words(m), task=task, budget=f"{100 * b:.0f}%", value=mine,
                                 exact=exact, baseline=base[0] if base else "none run",
                                 baseline_value=base[1] if base else None,
                                 call=interval_call(mine, base[1], lower) if base else "not shown",
                                 compress_ms=t.get("compress"), prefill_ms=t.get("prefill")))
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
    from kvbounds.battery import MIN_STREAMS
    small = sorted({int(r["value"]["n"]) for r in rows if r["value"].get("n")})
    if small and small[0] < MIN_STREAMS:
        span = f"{small[0]}" if len(small) == 1 else f"{small[0]}-{small[-1]}"
        notes.append(f"the end-to-end calls read the intervals: {span} instances per cell, fewer than the "
                     f"{MIN_STREAMS} pairs the battery's paired calls need")
    rows += _decode_rows(board, verdicts)
    if any(r["task"].startswith("decode") for r in rows):
        notes.append("decode error is measured at the decode check's own memory (its budget column), where exact "
                     "attention's error is 0; its call is the battery's paired test where the verdict carries one")
    if not rows:
        return None
    return {"rows": rows, "not_run": not_run, "notes": notes, "in_words": in_words(rows)}


def in_words(rows: list[dict]) -> str:
    """The table's answer in one sentence per budget: how many (method, task) rows are better / worse / not shown
    against the better standard baseline, and which methods are better or worse where."""
    out = []
    for budget in dict.fromkeys(r["budget"] for r in rows):
        rs = [r for r in rows if r["budget"] == budget]
        n = Counter(r["call"] for r in rs)
        where = lambda call: sorted({f"{r['method']} ({r['task'].split(':')[0]})" for r in rs if r["call"] == call})
        text = (f"At {budget} of the memory, of {len(rs)} (method, task) comparisons with the better of StreamingLLM "
                f"and uniform sampling, {n['better']} {'is' if n['better'] == 1 else 'are'} better, {n['worse']} worse "
                f"and {n['not shown'] + n['tied']} not shown either way")
        if where("better"):
            text += f"; better: {', '.join(where('better'))}"
        if where("worse"):
            text += f"; worse: {', '.join(where('worse'))}"
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
            paired = _paired_call(verdicts[cid], DECODE_CONTROLS[base[0]]) if cid and base else ""
            out.append(dict(method=r["method"], variant=cid and verdicts[cid].variant.replace("variant measured: ", ""),
                            task=metric, budget=f"{100 * _num(r['budget']):.0f}%", value=mine,
                            exact={"value": 0.0, "ci": [0.0, 0.0], "n": 0}, baseline=base[0] if base else "none run",
                            baseline_value=base[1] if base else None,
                            call=paired or (interval_call(mine, base[1], True) if base else "not shown"),
                            compress_ms=None, prefill_ms=None))
    return out


def markdown_lines(table: dict | None) -> list[str]:
    """The table as markdown, with the (method, budget) pairs not run and the notes below it."""
    if not table:
        return ["No end-to-end records in this run: run `make report` for the practitioner's table."]
    lines = [f"**In short**: {table['in_words']}", ""] if table.get("in_words") else []
    lines += ["| method | task | budget | method [95% CI] | exact | best baseline [95% CI] | call | compress / prefill "
              "(ms per token) |", "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        ex = f"{r['exact']['value']:.3g}" if r["exact"] else "-"
        t = (f"{r['compress_ms']:.3g} / {r['prefill_ms']:.3g}" if r["compress_ms"] is not None else "not timed")
        task = r["task"].replace("|", "\\|")          # a norm's bars inside a table cell
        lines.append(f"| {r['method']} | {task} | {r['budget']} | {fmt(r['value'])} | {ex} | {r['baseline']} "
                     f"{fmt(r['baseline_value'])} | **{r['call']}** | {t} |")
    lines.append("")
    words = {r["method"]: r["variant"] for r in table["rows"] if r["variant"]}
    if words:
        lines.append("- Methods: " + "; ".join(f"{m}: {w}" for m, w in words.items()) + ".")
    lines += [f"- Not run: {x}." for x in table["not_run"]] + [f"- {x}." for x in table["notes"]]
    return lines + [""]
