"""Hypothesis strategies of KV streams (:class:`kvbounds.streams.KVStream`).

    from hypothesis import given
    from kvbounds.testing.strategies import kv_streams

    @given(kv_streams(families=("concentrated", "huge norms"), max_n=256))
    def test_my_press_keeps_the_heavy_tokens(stream):
        ...

A stream is drawn as (family, n, d, seed) and built by :func:`kvbounds.streams.make_stream`; hypothesis
shrinks a failing one toward the first family listed, the smallest n and d and seed 0, and prints it as the
``make_stream(...)`` call that rebuilds it. The real families (slices of the cached SmolLM2 / MiniLM traces) are
drawn only from a prepared trace cache, never extracted inside a draw: ``families=None`` takes every family whose
traces are here; a real family named in ``families`` whose model is missing is left out, and one whose model is here
but whose traces are not prepared is an InputError giving the one command that prepares them
(``kvbounds traces extract --model smollm2 --tokens 2048``).
"""
from __future__ import annotations

from kvbounds.algorithms.validation import InputError, check_int

from kvbounds.streams import (FAMILIES, MAX_DIM, MAX_TOKENS, REAL, REAL_TOKENS, make_stream, real_available,
                              real_prepared)

__all__ = ["kv_streams", "families_here"]


def families_here(families=None) -> tuple[str, ...]:
    """``families`` (default: every family) less the real ones that cannot be read here without extracting (module
    docstring): left out when their model is missing or (``families=None``) their traces are not prepared; a real
    family asked for by name with its model here and its traces not prepared is an InputError naming the command."""
    fams = FAMILIES if families is None else families
    if isinstance(fams, str) or not hasattr(fams, "__iter__"):
        raise InputError(f"families must be a sequence of family names, got {fams!r}")
    fams = tuple(fams)
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown or not fams:
        raise InputError(f"unknown stream families {unknown}; choose among {FAMILIES}" if unknown
                         else "families is empty")
    out = []
    for f in fams:
        if f not in REAL:
            out.append(f)
            continue
        if real_available(f) is not None:
            continue
        why = real_prepared(f)
        if why is None:
            out.append(f)
        elif families is not None:
            raise InputError(f"kv_streams: {why} (a draw never extracts them)")
    return tuple(out)


def kv_streams(families=None, *, min_n: int = 4, max_n: int = 128, min_d: int = 2, max_d: int = 16,
               dv: int | None = None):
    """A hypothesis strategy of :class:`~kvbounds.streams.KVStream` objects (``.K``, ``.V``, ``.Q``,
    ``.family``) over ``families`` (default: :data:`~kvbounds.streams.FAMILIES` available here), with
    ``min_n <= n <= max_n`` tokens (a real family: at most its cached length) and ``min_d <= d <= max_d`` (``rope``
    draws an even d in that range; a real family has its model's d), values of dimension ``dv`` (default d). With
    ``min_d = max_d`` odd, the default families leave ``rope`` out (every other family draws the odd d); a list that
    names ``rope`` is refused. Refused (InputError): unknown families, none available here, bounds out of order or
    beyond :func:`~kvbounds.streams.make_stream`'s (n <= 10^6, d and dv <= 4096), min_n < 4 or min_d < 2
    (the heavy-hitter family's least stream)."""
    from hypothesis import strategies as st
    min_n = check_int(min_n, "min_n", minimum=4, maximum=MAX_TOKENS)
    max_n = check_int(max_n, "max_n", minimum=min_n, maximum=MAX_TOKENS)
    min_d = check_int(min_d, "min_d", minimum=2, maximum=MAX_DIM)
    max_d = check_int(max_d, "max_d", minimum=min_d, maximum=MAX_DIM)
    if dv is not None:
        check_int(dv, "dv", minimum=1, maximum=MAX_DIM)
    fams = families_here(families)
    if "rope" in fams and min_d % 2 and max_d == min_d:
        if families is not None:
            raise InputError(f"the rope family needs an even d; min_d = max_d = {min_d} is odd (leave rope out of "
                             "families, or allow an even d)")
        fams = tuple(f for f in fams if f != "rope")         # every other family draws the odd d
    if not fams:
        raise InputError(f"none of the families {families} can be built here (their models are missing)")

    @st.composite
    def draw_stream(draw):
        family = draw(st.sampled_from(fams))
        n = draw(st.integers(min_n, min(max_n, REAL_TOKENS.get(family, max_n))))
        d = draw(st.integers(min_d, max_d))
        if family == "rope" and d % 2:
            d = d + 1 if d < max_d else d - 1
        seed = draw(st.integers(0, 2**32 - 1))
        return make_stream(family, n, d, seed, dv=None if family in REAL else dv)

    return draw_stream()

