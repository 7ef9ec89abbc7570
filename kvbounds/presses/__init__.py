"""kvbounds' compressors as presses: NVIDIA kvpress presses (``with press(model): model.generate(...)``) and the
streaming presses that keep every layer at a fixed size while tokens arrive, with their live error bars.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import kvbounds.e2e,
kvbounds.methods, kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
# The room's modules load on first use of a name (PEP 562): every press needs torch, transformers and (for
# kvpress's) kvpress. The kvpress press classes of our methods are built from the method registry (one per press a
# registered method names, kvbounds.presses._kvpress), so a new method's press is found here by its name.
from typing import TYPE_CHECKING

from kvbounds import _lazy_face, methods as registry

if TYPE_CHECKING:   # what static tools (mypy, jedi) read
    from ._kvpress import PRESSES, KVBoundsPress, pipeline, press_class, weighted_answers
    from ._streaming.certificate import ErrorBar
    from ._streaming.generate import cache_keyword, generate
    from ._streaming.press import StreamingPress, log_weights, weighted_output
    from ._streaming.presses import StreamingBalanceKVPress, StreamingSubGenPress

_NAMES = {
    'KVBoundsPress': '._kvpress',
    'PRESSES': '._kvpress',
    'press_class': '._kvpress',
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

__all__ = sorted(_NAMES)


def _press_names() -> list[str]:
    """The kvpress press classes of our registered methods (each one's ``press``), built by ._kvpress."""
    return list(dict.fromkeys(m.press for m in registry.methods(source="kvbounds") if m.press))


_press_names.home = "._kvpress"
__getattr__, __dir__ = _lazy_face(__name__, _NAMES, _press_names)
