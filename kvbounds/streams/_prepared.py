"""The real families' prepared traces: whether the cached extraction a real stream reads is here, the one-line
command that prepares it, and the extraction itself with progress for the one caller that may extract
(``kvbounds evaluate``, before its workers start).

A real stream (:func:`kvbounds.streams.make_stream`) reads one (layer, head) of its model's trace on the cached text
(``REAL``: SmolLM2 at 2048 tokens, MiniLM at 512, every layer). Without the cache, the first stream extracts it: a
forward pass of the model and several hundred MB written (SmolLM2: about 419 MB, minutes on 2 cores). A hypothesis
draw must never do that (:mod:`kvbounds.testing.strategies` draws a real family only when :func:`real_prepared`
says it is here); ``kvbounds evaluate`` says it is extracting and shows that it is alive (:func:`prepare_real`).
"""
from __future__ import annotations

import sys
import threading
import time

from kvbounds.algorithms.validation import check_choice

from ._names import REAL

__all__ = ["prepare_command", "real_prepared", "prepare_real"]

HEARTBEAT_S = 20.0


def _model(family: str) -> tuple[str, int]:
    from ._power import REAL as MODELS
    check_choice(family, "family", REAL)
    return MODELS[family]


def prepare_command(family: str) -> str:
    """The one line that prepares ``family``'s traces: ``kvbounds traces extract --model M --tokens N``."""
    model, n = _model(family)
    return f"kvbounds traces extract --model {model} --tokens {n}"


def real_prepared(family: str) -> str | None:
    """None when ``family``'s model is here and its traces are cached (every layer), else why, with the command
    that prepares them. Reads the cache's index only (no model is loaded, nothing is extracted)."""
    from kvbounds.traces.real import MODEL_INFO, available, cached_extraction
    model, n = _model(family)
    why = available(model)
    if why:
        return why
    ex = cached_extraction(model, n, None, None)
    if ex is None or set(ex.layers) != set(range(MODEL_INFO[model]["n_layers"])):
        return f"{family}'s traces are not prepared here; prepare them once with `{prepare_command(family)}`"
    return None


def prepare_real(family: str, progress: bool = True) -> None:
    """Extract ``family``'s traces when its model is here and they are not cached, saying so on stderr (what, where
    to, and a line every :data:`HEARTBEAT_S` seconds while it runs; the time it took at the end). Nothing when
    they are cached or the model is missing (the streams then say why)."""
    from kvbounds.traces.real import available, extract
    model, n = _model(family)
    if available(model) or real_prepared(family) is None:
        return
    if not progress:
        extract(model, n)
        return
    t0 = time.perf_counter()
    sys.stderr.write(f"kvbounds: extracting {family}'s traces ({model}, {n} tokens, every layer; once, into the trace "
                     f"cache; SmolLM2's take minutes and about 419 MB): `{prepare_command(family)}` does the same\n")
    done = threading.Event()

    def beat():
        while not done.wait(HEARTBEAT_S):
            sys.stderr.write(f"  still extracting {family}'s traces ({time.perf_counter() - t0:.0f} s)\n")

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        extract(model, n)
    finally:
        done.set()
        t.join()
    sys.stderr.write(f"  {family}'s traces extracted in {time.perf_counter() - t0:.0f} s\n")
