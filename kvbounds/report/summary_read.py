"""Read ``summary.json`` back: the verdicts as :class:`kvbounds.verdict.Verdict` objects, so that the markdown
(``docs/RESULTS.md`` and the README's "What we found") renders from that one file exactly as from the records.

``make results-md`` writes the run's summary.json compactly to ``docs/summary.json`` (:func:`compact`: one line per
claim, without the unique findings, which the markdown recomputes from the verdicts) and renders both documents from
it; tests/docs/test_results_md.py checks that the committed documents are what that file renders to.
"""
from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from pathlib import Path

from kvbounds.algorithms.validation import InputError
from kvbounds import verdict as vf
from ._rows import (CALL_ROW, PAPER_ANSWER, POWER_SETTING_ROW, PRACTITIONER_ROW, check_board_rows, check_row,
                    check_rows, fits_row, in_float_range, short_repr)
from ._summary import SUMMARY_KEYS
from kvbounds.verdict import Verdict
from kvbounds.core import special_file
from kvbounds.core import OutputRefused, check_output, write_output

__all__ = ["check_summary_extras", "verdict_from_dict", "verdicts_from_summary", "load_summary", "compact", "main"]

_NESTED = {"findings": vf.Finding, "errata": vf.Erratum, "reproductions": vf.Reproduction, "rate_info": vf.RateInfo,
           "proven_constant": vf.Constant, "fitted_constant": vf.Constant, "vacuity": vf.Vacuity}
_NON_FINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _floats(x):
    """summary.json's "inf" / "-inf" / "nan" strings back to floats (:func:`kvbounds.core.jsonable` wrote them)."""
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return _NON_FINITE.get(x, x) if isinstance(x, str) else x


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object",
          list: "a list", tuple: "a list"}


def _fits(v, hint) -> bool:
    """Does a JSON value fit a field's annotation (str, int, float, bool, dict, list, tuple[float, ...], X | None)?"""
    args = typing.get_args(hint)
    if hint is type(None):
        return v is None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(v, a) for a in args)
    origin = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(origin):
        return isinstance(v, origin)
    if origin is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and in_float_range(v)
    if origin is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if origin is tuple:
        return isinstance(v, (list, tuple)) and (not args or len(v) == len(args)) and \
            all(_fits(x, a) for x, a in zip(v, args))
    if origin is list:
        return isinstance(v, list) and (not args or all(_fits(x, args[0]) for x in v))
    return isinstance(v, origin) if isinstance(origin, type) else True


def _kind(hint) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = typing.get_origin(hint) or hint
    if base in (typing.Union, types.UnionType):
        return " or ".join(_kind(a) for a in args) + (" or null" if type(None) in typing.get_args(hint) else "")
    if dataclasses.is_dataclass(base):
        return f"an object of the fields of {base.__name__}"
    if base is tuple and args:
        return f"a list of {len(args)} numbers"
    return _KINDS.get(base, str(hint))


def _build(cls, d, where: str):
    """A dataclass from its dict: unknown keys dropped (a finding's id), lists back to tuples where the field is one;
    a missing required field or a value of the wrong type is an InputError naming ``where`` and the field."""
    if not isinstance(d, dict):
        raise InputError(f"{where} is {type(d).__name__} {short_repr(d)}, not an object of the fields of "
                         f"{cls.__name__}")
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(f"{where} has no {f.name!r} (a {cls.__name__} needs it)")
            continue
        v = d[f.name]
        if not _fits(v, hints[f.name]):
            raise InputError(f"{where}: {f.name!r} is {short_repr(v)}, not {_kind(hints[f.name])}")
        if isinstance(v, list) and "tuple" in str(hints.get(f.name, "")):
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


_DIMENSIONS = {"statement": ("",) + vf.STATEMENT_VALUES, "proof": vf.PROOF_VALUES, "rate": vf.RATE_VALUES,
               "reproduction": vf.REPRODUCTION_VALUES, "power": vf.POWER_VALUES}


def check_summary_extras(summary: dict, where: str = "the summary") -> None:
    """The parts of summary.json beside the claims that the markdown reads ("papers", "practitioner",
    "leaderboard", "run"): InputError naming the key and the field that is missing or of the wrong type."""
    papers, prac, board, run = (summary.get(k) for k in ("papers", "practitioner", "leaderboard", "run"))
    if papers is not None:
        if not isinstance(papers, dict):
            raise InputError(f"{where}: 'papers' is {short_repr(papers)}, not an object of answers")
        for name, a in papers.items():
            check_row(a, PAPER_ANSWER, f"{where}: papers[{name!r}]")
    if prac is not None:
        check_row(prac, {"rows": "list", "not_run": "list", "notes": "list", "in_words": "~str?"},
                   f"{where}: practitioner")
        check_rows(prac["rows"], PRACTITIONER_ROW, f"{where}: practitioner: rows")
        for key in ("not_run", "notes"):
            if not all(isinstance(x, str) for x in prac[key]):
                raise InputError(f"{where}: practitioner: {key!r} holds a non-string line")
    if board is not None:
        check_board_rows(board, f"{where}: leaderboard")
    if run is not None and not isinstance(run, dict):
        raise InputError(f"{where}: 'run' is {short_repr(run)}, not an object")


def _check_power_fields(v: Verdict, where: str) -> None:
    check_rows(v.power_calls, CALL_ROW, f"{where}: power_calls")
    check_rows(v.power_table, POWER_SETTING_ROW, f"{where}: power_table")
    for i, row in enumerate(v.power_table):
        for name, call in (row.get("calls") or {}).items():
            check_row(call, CALL_ROW, f"{where}: power_table[{i}]: calls[{name!r}]")
        for name, x in (row.get("controls") or {}).items():
            if not (x is None or fits_row(x, "num")):
                raise InputError(f"{where}: power_table[{i}]: controls[{name!r}] is {short_repr(x)}, not a number")


def verdict_from_dict(d: dict, where: str = "the verdict") -> Verdict:
    """A Verdict from its summary.json dict; a field that is missing, of the wrong type or (for the verdict
    dimensions) not one of its values is an InputError naming ``where`` and the field."""
    if not isinstance(d, dict):
        raise InputError(f"{where} is {type(d).__name__} {short_repr(d)}, not an object of verdict fields")
    d = dict(_floats(d))
    for name, cls in _NESTED.items():
        v = d.get(name)
        if isinstance(v, list):
            d[name] = [_build(cls, x, f"{where}: {name}[{i}]") for i, x in enumerate(v)]
        elif isinstance(v, dict):
            d[name] = _build(cls, v, f"{where}: {name}")
    v = _build(Verdict, d, where)
    for name, allowed in _DIMENSIONS.items():
        if getattr(v, name) not in allowed:
            raise InputError(f"{where}: {name} = {short_repr(getattr(v, name))} is not one of "
                             f"{', '.join(allowed[-6:])}")
    _check_power_fields(v, where)
    return v


def verdicts_from_summary(summary: dict) -> dict[str, Verdict]:
    """Claim id -> Verdict, in the file's order of claims (summary.json sorts its keys: the registry's order is
    restored where the registry knows the claims)."""
    from kvbounds import claims as registry
    if not isinstance(summary, dict):
        raise InputError(f"a summary is an object of claim verdicts, not {type(summary).__name__}")
    bad = [k for k in summary if not isinstance(k, str)]
    if bad:
        raise InputError(f"a summary's claim ids are strings, not {short_repr(bad[0])}")
    ids = [k for k in summary if k not in SUMMARY_KEYS]
    order = {cid: i for i, cid in enumerate(registry.CLAIMS)}
    ids.sort(key=lambda c: (order.get(c, len(order)), c))
    check_summary_extras(summary)
    return {cid: verdict_from_dict(summary[cid], f"claim {cid!r}") for cid in ids}


def load_summary(path) -> dict:
    """summary.json as a dict; a file that cannot be read, is not JSON or holds no object is an InputError naming
    the file; so is one that is not a regular file (a FIFO is refused before it is opened: no read that blocks)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"a summary's path must be a str or os.PathLike, got {short_repr(path)}")
    what = special_file(path)
    if what:
        raise InputError(f"cannot read {path}: it is {what}, not a summary.json")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        summary = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{path} is not JSON ({e}); pass a summary.json that `kvbounds report` wrote") from None
    if not isinstance(summary, dict):
        raise InputError(f"{path} holds a JSON {type(summary).__name__}, not a summary's object of claim verdicts")
    return summary


def compact(summary: dict) -> str:
    """summary.json as ``docs/summary.json`` keeps it: what the markdown reads (every key but the unique findings,
    recomputed from the verdicts), one line per top-level key (claims, papers, ...) so that a new run's diff is
    per claim, keys sorted: the same summary gives the same bytes."""
    keep = {k: v for k, v in sorted(summary.items()) if k != "findings"}
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(',', ':'))}"
                       for k, v in keep.items())
    return "{\n" + body + "\n}\n"


def main(argv=None) -> int:
    """``python -m kvbounds.report.summary_read SUMMARY.json OUT.json``: write :func:`compact` of SUMMARY.json to
    OUT.json."""
    import sys
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: python -m kvbounds.report.summary_read SUMMARY.json OUT.json", file=sys.stderr)
        return 2
    try:
        check_output(args[1], inputs=[args[0]])         # before any work: a device, a FIFO, a store, its own input
        summary = load_summary(args[0])
        verdicts_from_summary(summary)          # what the markdown will read: refused here, before writing
        write_output(args[1], compact(summary), inputs=[args[0]])
    except (InputError, OutputRefused) as e:
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
