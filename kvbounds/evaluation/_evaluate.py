"""``kvbounds evaluate SPEC`` and its Python twin :func:`evaluate`: any press or compressor against the battery of
controls at equal memory, on adversarial and real KV streams, with three-way calls; optionally end to end and at
decode time.

What it runs (``profile``: smoke, quick, full):
  * the battery (:mod:`kvbounds.battery`: zeros, the mean, StreamingLLM with 4 sink tokens, a weighted uniform
    sample, and the method's ablation where the registry names one) on the stream families of
    :mod:`kvbounds.evaluation` (synthetic benign, concentrated, clustered, low rank, real SmolLM2, real
    MiniLM) at several memory fractions (quick: 10%, 25%, 50%, and 1 - ratio), memory counted the same way for the
    method and every control;
  * per fraction, the calls of :func:`kvbounds.battery.power_vs_controls` (:mod:`kvbounds.verdict`: better /
    leaning better / tied / leaning worse / worse / not attainable / not tested, each with the effect method /
    control (the Hodges-Lehmann estimate), its 95% interval, the win
    count and the smallest detectable ratio; Holm over the fraction's (family, control) pairs);
  * the regime curve: per family, the smallest fraction at which the method is better than every control, or
    "never in range";
  * ``e2e``: the leaderboard's tasks inside SmolLM2 (:mod:`kvbounds.evaluation`); ``decode`` (or a decoding
    press): the battery while the cache is recompressed as a stream grows (:mod:`kvbounds.evaluation`).

Outputs in ``out``: the records (``results.jsonl``, resumable: rerunning the same command skips finished trials, as
``kvbounds check`` does), ``evaluation.json`` (:func:`summary`) and ``evaluation.html`` (a card like a claim's,
:mod:`kvbounds.evaluation`). Errors (:class:`EvaluationError`): a SPEC that does not resolve, a bad ratio or
profile, a press that raises or returns a bad cache on the first stream of a family (checked before any record is
written), a trial that raised (its error kept in the records; evaluation.json and the card are not written).
"""
from __future__ import annotations

import os
import sys
import time

from kvbounds.algorithms.validation import InputError, check_choice, check_int

from . import _streams as ES
from ._card import CARD_FILE, JSON_FILE

__all__ = ["EvaluationError", "evaluate", "summary", "calls_of", "regime", "default_out", "check_arguments",
           "stream_words", "JSON_FILE", "CARD_FILE"]

METRIC = ("relative attention error over held-out queries: mean_q ||Attn_hat(q) - Attn(q)|| / ||Attn(q)|| "
          "(zeros scores 1)")


class EvaluationError(InputError):
    """An evaluation that cannot run or could not finish (the message says why; exit 2 on the command line)."""


def default_out(spec: str) -> str:
    """``evaluation/<SPEC with every character but letters, digits, '.', '_' and '-' as '_'>``."""
    return os.path.join("evaluation", "".join(c if c.isalnum() or c in "._-" else "_" for c in spec))


def _trials(spec, profile, ratio, seed):
    from kvbounds.run import Trial
    return [Trial(ES.CLAIM, p, seed, "numpy", ES.__name__) for p in ES.trials(spec, profile, ratio, seed)]


MAX_WORKERS = 1024


def check_arguments(*, profile, e2e, decode, out, workers, seed, progress) -> None:
    """:func:`evaluate`'s arguments other than SPEC and ratio (:func:`kvbounds.evaluation._spec.resolve` and
    ``check_ratio`` check those): an :class:`~kvbounds.algorithms.validation.InputError` naming the first bad one."""
    check_choice(profile, "profile", ES.PROFILES)
    for name, v in (("e2e", e2e), ("decode", decode), ("progress", progress)):
        if not isinstance(v, bool):
            raise InputError(f"{name} must be True or False, got {v!r}")
    if out is not None and (not isinstance(out, (str, os.PathLike)) or not os.fspath(out)
                            or "\0" in os.fspath(out)):
        raise InputError(f"out must be a directory path (str or os.PathLike) or None, got {out!r}")
    if workers is not None:
        check_int(workers, "workers", minimum=1, maximum=MAX_WORKERS)
    check_int(seed, "seed", minimum=0, maximum=2**63 - 1)


def stream_words(params: dict) -> str:
    """The stream of an evaluate trial in words: its family, its index and the call that rebuilds it."""
    n = params.get("n", 0) + params.get("queries", 0)
    return (f"the {params.get('family')} stream #{params.get('rep')} (make_stream({params.get('family')!r}, "
            f"n={n}, d={params.get('d')}, seed={params.get('stream_seed')}))")


def _preflight(resolved, trials) -> None:
    """The first stream of each family at every fraction, in this process, nothing written: a press that raises
    (anything, SystemExit too) or returns a bad cache stops the evaluation here (:class:`EvaluationError`, one line
    naming the method and the stream)."""
    seen = set()
    for t in trials:
        if t.params["family"] in seen:
            continue
        seen.add(t.params["family"])
        try:
            ES.run_trial(dict(t.params), 0)
        except InputError as e:
            raise EvaluationError(f"{resolved.spec} on {stream_words(t.params)}: {' '.join(str(e).split())}") \
                from None
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's method raised: one line, not a traceback
            msg = " ".join(str(e).split())[:300]
            raise EvaluationError(f"{resolved.spec} raised {type(e).__name__}{': ' + msg if msg else ''} on "
                                  f"{stream_words(t.params)}") from None


def calls_of(records, fractions) -> tuple[list[dict], dict]:
    """(every call, fraction -> the power rule's result) from the battery records: one power rule per fraction
    (Holm over its (family, control) pairs), setting = the family. Each call dict is
    :class:`kvbounds.battery._power_calls.Call`'s,
    with ``fraction`` the fraction asked and ``held_fraction`` the method's floats over the stream's."""
    from kvbounds.battery import power_vs_controls, stream_unit, unit_words
    out, power = [], {}
    for f in fractions:
        rs = [r for r in records if abs(float(r.extra.get("fraction", -1)) - f) < 1e-9]
        if not rs:
            continue
        p = power_vs_controls(rs, setting=lambda r: r.extra["family"], metric="relative attention error",
                              unit=unit_words, unit_of=stream_unit, named_metric="practitioner")
        power[f] = p
        for c in p.calls:
            out.append(dict(c, held_fraction=c["fraction"], fraction=f))
    return out, power


def regime(calls: list[dict], families, fractions) -> dict:
    """Per family: the smallest fraction at which every tested call is ``better`` (at least one tested), or None
    ("never in range"), with the words: "from X%" when it beats every control at every larger fraction too, else
    the fractions where it does and those above X% where it does not."""
    out = {}
    lo, hi = min(fractions), max(fractions)
    for fam in families:
        if not any(c["family"] == fam and c["call"] != "not tested" for c in calls):
            out[fam] = dict(smallest_fraction=None, text="not tested")
            continue
        beats = []
        for f in sorted(fractions):
            cs = [c for c in calls if c["family"] == fam and c["fraction"] == f and c["call"] != "not tested"]
            if cs and all(c["call"] == "better" for c in cs):
                beats.append(f)
        best = beats[0] if beats else None
        span = f"{100 * lo:.0f}%" if lo == hi else f"{100 * lo:.0f}%-{100 * hi:.0f}%"
        pct = lambda fs: ", ".join(f"{100 * f:.0f}%" for f in fs)
        above = [f for f in sorted(fractions) if best is not None and f >= best]
        if best is None:
            text = f"never in range ({span})"
        elif beats == above:        # from the smallest such memory on, at every larger one tested
            text = f"better than every control from {100 * best:.0f}% of the cache's floats"
        else:                       # not monotone: say where it does and where, above the smallest, it does not
            text = (f"better than every control at {pct(beats)} of the cache's floats (not at "
                    f"{pct([f for f in above if f not in beats])})")
        out[fam] = dict(smallest_fraction=best, text=text)
    return out


def summary(resolved, records, *, profile, ratio, seed, fractions, families, extra=None) -> dict:
    """The content of evaluation.json (the README's "Evaluate your own method" names its fields)."""
    from kvbounds import battery
    from kvbounds.verdict import CALLS
    from kvbounds.verdict import summary_words
    calls, power = calls_of(records, fractions)
    headline_f = round(1.0 - ratio, 6)
    head = [c for c in calls if c["fraction"] == headline_f]
    controls = sorted({c["control"] for c in calls}, key=lambda n: list(battery.CONTROLS).index(n)
                      if n in battery.CONTROLS else 99)
    missing = sorted({f"{r.extra['family']}: {r.extra['missing']}" for r in records if r.extra.get("missing")})
    return {
        "method": resolved.name, "spec": resolved.spec, "kind": resolved.kind, "label": resolved.label,
        "ratio": ratio, "fraction": headline_f, "profile": profile, "seed": seed,
        "battery": controls or [c for c in battery.CONTROLS if c != "ablation"],
        "call_vocabulary": list(CALLS), "metric": METRIC,
        "families": list(families), "fractions": list(fractions),
        "headline": summary_words(head) or "not tested", "calls": calls,
        "regime": regime(calls, families, fractions),
        "streams": len({(r.params["family"], r.params["rep"]) for r in records}),
        "not_run": missing, **(extra or {}),
    }


def evaluate(spec: str, *, ratio: float = 0.75, profile: str = "quick", e2e: bool = False, decode: bool = False,
             out: str | os.PathLike | None = None, workers: int | None = None, seed: int = 0,
             progress: bool = True) -> dict:
    """Evaluate SPEC (a registered method, ``kvpress:NAME`` or ``module:NAME``; :mod:`kvbounds.evaluation`) at
    kvpress compression ratio ``ratio`` (the fraction removed; the headline fraction is 1 - ratio) on ``profile``;
    writes ``out`` (default :func:`default_out`) and returns evaluation.json's content. ``workers``: processes for
    the stream trials (default: all cores; smoke runs in this process). Every argument is checked first
    (:func:`check_arguments`: an InputError naming it). A ``module:NAME`` SPEC imports with the current directory
    first on the module path, as ``python -m`` does: in this process only while it imports, in the worker processes
    by their start-up; ``os.environ`` and ``sys.path`` are left as they were. ``out`` must not be a ``kvbounds
    check`` store. Raises :class:`EvaluationError` (and :class:`kvbounds.core.StoreError` for an unusable
    ``out``)."""
    from ._card import write_outputs
    from ._spec import check_ratio, resolve
    from kvbounds.core import ResultStore
    from kvbounds.run import run_trials
    check_arguments(profile=profile, e2e=e2e, decode=decode, out=out, workers=workers, seed=seed, progress=progress)
    ratio = check_ratio(ratio)
    out = default_out(spec) if out is None and isinstance(spec, str) else out
    if out is not None:
        ResultStore(out, writer="evaluate").check_writer()      # another command's store: refused before any work
    resolved = resolve(spec, ratio)
    if workers is None and profile == "smoke":
        workers = 1                 # its few trials take less than starting worker processes that import torch
    t0, c0 = time.perf_counter(), time.process_time()
    trials = _trials(spec, profile, ratio, seed)
    _preflight(resolved, trials)
    # the worker processes import the SPEC's module too: the current directory first on their path (given to them)
    sys_path = [os.getcwd()] if ":" in spec and not spec.startswith("kvpress:") else []
    timings: dict = {}
    run_trials(trials, out=out, workers=workers, progress=progress, timings=timings,
               run=dict(profile=profile, backend="numpy", seed=seed), writer="evaluate", sys_path=sys_path)
    contents = ResultStore(out).read()
    keys = {t.key for t in trials}
    errors = [e for e in contents.errors if e.key in keys]
    if errors:
        raise EvaluationError(f"{len(errors)} stream trial(s) raised (kept in {out}/results.jsonl; rerun to retry), "
                              f"first: {resolved.spec} on {stream_words(errors[0].params)}: {errors[0].error}")
    records = [r for r in contents.records if r.key in keys]
    extra = {}
    if decode or resolved.decoding:
        from ._decode import run_decode
        extra["decode"] = run_decode(resolved, profile=profile, ratio=ratio, seed=seed, out=out, workers=workers,
                                     progress=progress, sys_path=sys_path)
    if e2e:
        from ._e2e import run_e2e
        extra["e2e"] = run_e2e(resolved, profile=profile, ratio=ratio, seed=seed, out=out, progress=progress)
    extra["time"] = dict(wall_s=round(time.perf_counter() - t0, 1), cpu_s_this_process=round(time.process_time() - c0, 1),
                         trials_cpu_s=timings.get("cpu_s"), workers=timings.get("workers"))
    result = summary(resolved, records, profile=profile, ratio=ratio, seed=seed,
                     fractions=ES.fractions(profile, ratio), families=ES.families(profile), extra=extra)
    write_outputs(out, result)
    if progress:
        sys.stderr.write(f"kvbounds evaluate: {resolved.spec}: {result['headline']}\n")
    return result
