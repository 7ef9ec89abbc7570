"""Helpers shared by the checks: profile grids, trial RNGs, record construction, failure tolerances."""
from __future__ import annotations

import itertools
import math
from typing import Any, Iterable

import numpy as np
from scipy import stats

from kvbounds.core import DEFERRED, Record
from kvbounds.core import make_record, pick, unit_directions  # noqa: F401 - the check kit's, from the core (issue 44)

__all__ = ["grid", "on_gpu", "deferred_record", "rng", "failure_rate_ok", "clopper_pearson", "log2_int",
           "fallback_notes", "dispatch", "in_words", "words_in_findings"]


def grid(**axes: Iterable[Any]) -> list[dict]:
    """Cartesian product of parameter axes as a list of dicts."""
    keys = list(axes)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(list(axes[k]) for k in keys))]


def on_gpu(backend: str) -> bool:
    """A GPU backend (torch:cuda[:i] or cupy): the gpu profile runs its largest trials only there."""
    return backend.startswith("torch:cuda") or backend == "cupy"


def deferred_record(claim: str, params: dict, *, reason: str, source: str = "") -> Record:
    """The record of a trial not run on this backend (too large for it): no measurement. The verdict rules
    (``kvbounds.report.build_verdicts``) leave it out of the check's summary and list it under ``deferred``,
    unless the same parameters were measured on another backend."""
    return make_record(claim, params, measured=0.0, bound=0.0, holds=True, bound_kind="shape", check=DEFERRED,
                       source=source, deferred=reason)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def failure_rate_ok(failures: int, trials: int, p_claimed: float, *, alpha: float = 1e-3) -> tuple[bool, float]:
    """Is an observed failure count consistent with a claimed failure probability <= p_claimed?

    One-sided exact binomial test at level ``alpha``: the claim is rejected only when seeing this many
    failures would have probability < alpha if the true rate were p_claimed. Returns (ok, p-value)."""
    if trials == 0:
        return True, 1.0
    p = float(stats.binom.sf(failures - 1, trials, p_claimed)) if failures > 0 else 1.0
    return p >= alpha, p


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    a = 1 - conf
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def log2_int(x: float) -> float:
    return math.log2(x)


def fallback_notes(records) -> list[str]:
    """The summary line for records whose real trace was unavailable (extra["fallback"] names why)."""
    why = sorted({r.extra.get("fallback", "") for r in records} - {""})
    return ["SYNTHETIC FALLBACK (real model unavailable: " + "; ".join(why) + ")"] if why else []


def dispatch(key: str, trials: dict, default=None):
    """A check's ``run_trial`` that sends each trial to ``trials[params[key]]`` (``default`` for any other value of
    ``params[key]``, or when it is absent): ``run_trial = dispatch("sweep", {"power": power_trial}, default=...)``.
    Each function takes ``(params, seed, backend)``."""
    def run_trial(params: dict, seed: int, backend: str):
        fn = trials.get(params.get(key), default)
        if fn is None:
            raise ValueError(f"unknown {key} {params.get(key)!r}; known: {', '.join(map(str, trials))}")
        return fn(params, seed, backend)
    run_trial.__doc__ = (f"One trial: by params[{key!r}], " + ", ".join(f"{k!r} -> {f.__name__}" for k, f in trials.items())
                         + (f", otherwise {default.__name__}" if default else "") + ".")
    return run_trial


def in_words(text: str, words: dict) -> str:
    """``text`` with each of its sub-check labels (keys of ``words``) replaced by what a reader is told it is
    (a check name such as "paper c" stays the record's label; the verdict's sentences say "the walk's c as the
    paper states it"); longer labels first, so that one label inside another is not replaced twice."""
    for label in sorted(words, key=len, reverse=True):
        text = text.replace(label, words[label])
    return text


def words_in_findings(findings, words: dict) -> list:
    """The findings with :func:`in_words` applied to their titles and details."""
    import dataclasses
    return [dataclasses.replace(f, title=in_words(f.title, words), detail=in_words(f.detail, words)) for f in findings]
