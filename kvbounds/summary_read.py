"""Read ``summary.json`` back: the verdicts as :class:`kvbounds.verdict.Verdict` objects, so that the markdown
(``docs/RESULTS.md`` and the README's "What we found") renders from that one file exactly as from the records.

``make results-md`` writes the run's summary.json compactly to ``docs/summary.json`` (:func:`compact`: one line per
claim, without the unique findings, which the markdown recomputes from the verdicts) and renders both documents from
it; tests/test_results_md.py checks that the committed documents are what that file renders to.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from . import verdict_fields as vf
from .report_summary import SUMMARY_KEYS
from .verdict import Verdict

_NESTED = {"findings": vf.Finding, "errata": vf.Erratum, "reproductions": vf.Reproduction, "rate_info": vf.RateInfo,
           "proven_constant": vf.Constant, "fitted_constant": vf.Constant, "vacuity": vf.Vacuity}
_NON_FINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _floats(x):
    """summary.json's "inf" / "-inf" / "nan" strings back to floats (:func:`kvbounds.records.jsonable` wrote them)."""
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return _NON_FINITE.get(x, x) if isinstance(x, str) else x


def _build(cls, d: dict):
    """A dataclass from its dict: unknown keys dropped (a finding's id), lists back to tuples where the field is one."""
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if isinstance(v, list) and "tuple" in str(hints.get(f.name, "")):
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


def verdict_from_dict(d: dict) -> Verdict:
    d = dict(_floats(d))
    for name, cls in _NESTED.items():
        v = d.get(name)
        if isinstance(v, list):
            d[name] = [_build(cls, x) for x in v]
        elif isinstance(v, dict):
            d[name] = _build(cls, v)
    return _build(Verdict, d)


def verdicts_from_summary(summary: dict) -> dict[str, Verdict]:
    """Claim id -> Verdict, in the file's order of claims (summary.json sorts its keys: the registry's order is
    restored where the registry knows the claims)."""
    from . import registry
    ids = [k for k in summary if k not in SUMMARY_KEYS]
    order = {cid: i for i, cid in enumerate(registry.CLAIMS)}
    ids.sort(key=lambda c: (order.get(c, len(order)), c))
    return {cid: verdict_from_dict(summary[cid]) for cid in ids}


def load_summary(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def compact(summary: dict) -> str:
    """summary.json as ``docs/summary.json`` keeps it: what the markdown reads (every key but the unique findings,
    recomputed from the verdicts), one line per top-level key (claims, papers, ...) so that a new run's diff is
    per claim, keys sorted: the same summary gives the same bytes."""
    keep = {k: v for k, v in sorted(summary.items()) if k != "findings"}
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(',', ':'))}"
                       for k, v in keep.items())
    return "{\n" + body + "\n}\n"


def main(argv=None) -> int:
    """``python -m kvbounds.summary_read SUMMARY.json OUT.json``: write :func:`compact` of SUMMARY.json to OUT.json."""
    import sys
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: python -m kvbounds.summary_read SUMMARY.json OUT.json", file=sys.stderr)
        return 2
    from .output_files import write_output
    write_output(args[1], compact(load_summary(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
