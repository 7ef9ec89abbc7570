"""kvbounds' compressors as presses: NVIDIA kvpress presses (``with press(model): model.generate(...)``) and the
streaming presses that keep every layer at a fixed size while tokens arrive, with their live error bars.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import kvbounds.e2e,
kvbounds.methods, kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
# The room's modules load on first use of a name (PEP 562): every press needs torch, transformers and (for
# kvpress's) kvpress.
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # what static tools (mypy, jedi) read
    from ._kvpress import BalanceKVPress, pipeline, weighted_answers
    from ._streaming.certificate import ErrorBar
    from ._streaming.generate import cache_keyword, generate
    from ._streaming.press import StreamingPress, log_weights, weighted_output
    from ._streaming.presses import StreamingBalanceKVPress, StreamingSubGenPress

_NAMES = {
    'BalanceKVPress': '._kvpress',
    'pipeline': '._kvpress',
    'weighted_answers': '._kvpress',
    'ErrorBar': '._streaming.certificate',
    'cache_keyword': '._streaming.generate',
    'generate': '._streaming.generate',
    'StreamingPress': '._streaming.press',
    'log_weights': '._streaming.press',
    'weighted_output': '._streaming.press',
    'StreamingBalanceKVPress': '._streaming.presses',
    'StreamingSubGenPress': '._streaming.presses',
}


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
