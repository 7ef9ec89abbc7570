"""The rows the report reads from a verdict's power fields and from summary.json's other keys (the papers' answers,
the practitioner's table, the leaderboard), each checked against its schema before a renderer reads it, so that a
hand-made or edited row is an InputError naming the row and the field, never a KeyError or TypeError from inside a
table (:mod:`kvbounds.report.summary_read`, :mod:`kvbounds.report`, :mod:`kvbounds.report`)."""
from __future__ import annotations

from kvbounds.algorithms.validation import InputError


def short_repr(v) -> str:
    """``repr(v)`` cut to 60 characters, for an error message naming a value."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# the rows the markdown reads from a verdict's power fields and from summary.json's other keys: key -> its type
# ("num": a number, NaN and inf included; "pair": two numbers or nulls; a tuple of allowed strings: one of them; a
# trailing "?": null allowed too; a leading "~": the reader has a default, the key may be absent); keys not named
# here are not read and pass as they are
CALL_ROW = {"call": ("better", "leaning better", "tied", "leaning worse", "worse", "not attainable", "not tested"),
            "control": "str", "family": "str", "ci": "pair", "effect": "num?", "n": "int", "wins": "int",
            "smallest_p": "~num?", "detectable": "~num?", "reason": "~str?", "metric": "~str?", "scale": "~str?"}
POWER_SETTING_ROW = {"setting": "str", "method": "~num?", "ratio": "~num?", "ratio_ci": "~pair?",
                     "controls": "~dict?", "calls": "~dict?", "best": "~str?"}
BOARD_ROW = {"method": "str", "metric": "str", "budget": "~num?", "value": "~num?", "ci_low": "~num?",
             "ci_high": "~num?", "n": "~int?", "family": "~str?", "budget_label": "~str?", "memory_floats": "~int?",
             "note": "~str?", "rank": "~int?", "tied": "~bool?", "best": "~bool?", "units": "~dict?"}
VALUE_DICT = {"value": "num", "ci": "pair", "n": "~int?"}
PRACTITIONER_ROW = {"method": "str", "variant": "str", "task": "str", "budget": "str", "value": VALUE_DICT,
                    "exact": VALUE_DICT, "baseline": "str", "baseline_value": VALUE_DICT, "call": "str",
                    "compress_ms": "num?", "prefill_ms": "num?", "comparison": "~dict?"}
PAPER_ANSWER = {"answer": "str", "claims": "list", "papers": "list"}
_TYPES = {"str": (str,), "int": (int,), "num": (int, float), "bool": (bool,), "dict": (dict,), "list": (list,)}
FLOAT_MAX = 1.7976931348623157e308


def in_float_range(v) -> bool:
    """A JSON number a renderer can format as a float: any float (NaN and inf are read as such), an integer only
    within float range (a 400-digit integer would be an OverflowError in every ``:.3g``)."""
    return not isinstance(v, int) or isinstance(v, bool) or -FLOAT_MAX <= v <= FLOAT_MAX


def fits_row(v, kind) -> bool:
    """Does a JSON value fit a schema's kind (see above)?"""
    if isinstance(kind, str) and kind.startswith("~"):
        return fits_row(v, kind[1:])
    if isinstance(kind, str) and kind.endswith("?"):
        return v is None or fits_row(v, kind[:-1])
    if isinstance(kind, dict):
        return v is None or isinstance(v, dict)           # checked field by field by the caller
    if isinstance(kind, tuple):
        return v in kind
    if kind == "pair":
        return isinstance(v, (list, tuple)) and len(v) == 2 and all(x is None or fits_row(x, "num") for x in v)
    return isinstance(v, _TYPES[kind]) and (kind in ("bool", "dict", "list") or not isinstance(v, bool)) and \
        (kind != "num" or in_float_range(v))


def _want(kind) -> str:
    if isinstance(kind, tuple):
        return f"one of {', '.join(kind)}"
    if isinstance(kind, dict):
        return f"an object with {', '.join(map(repr, kind))}"
    kind = kind.lstrip("~")
    base = {"pair": "a list of 2 numbers", "num": "a number (within float range)", "int": "an integer", "str": "a string",
            "bool": "true or false", "dict": "an object", "list": "a list"}[kind.rstrip("?")]
    return base + (" or null" if kind.endswith("?") else "")


def check_row(row, schema: dict, where: str) -> None:
    """``row`` against ``schema`` (key -> kind, as above): InputError naming ``where``, the key and what it is."""
    if not isinstance(row, dict):
        raise InputError(f"{where} is {short_repr(row)}, not {_want(schema)}")
    for key, kind in schema.items():
        if key not in row:
            if isinstance(kind, str) and kind.startswith("~"):
                continue
            raise InputError(f"{where} has no {key!r}")
        v = row[key]
        if not fits_row(v, kind):
            raise InputError(f"{where}: {key!r} is {short_repr(v)}, not {_want(kind)}")
        if isinstance(kind, dict) and v is not None:
            check_row(v, kind, f"{where}: {key}")


def check_rows(rows, schema: dict, where: str) -> None:
    """A list of rows, each against ``schema``: InputError naming the row (``where[i]``) and the field."""
    if not isinstance(rows, list):
        raise InputError(f"{where} is {short_repr(rows)}, not a list")
    for i, row in enumerate(rows):
        check_row(row, schema, f"{where}[{i}]")


def check_board_rows(rows, where: str = "the leaderboard") -> None:
    """Leaderboard rows as the markdown and the practitioner's table read them (method, metric, budget, value and its
    interval, ...): InputError naming the row and the field that is missing or of the wrong type."""
    check_rows(rows, BOARD_ROW, where)
