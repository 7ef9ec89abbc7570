"""``kvbounds evaluate SPEC`` and its Python twin ``kvbounds.evaluate``: any press or compressor against the battery at
equal memory, on KV streams, optionally end to end and at decode time, with its card.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.report, kvbounds.streams, kvbounds.battery, kvbounds.e2e, kvbounds.run, kvbounds.methods, kvbounds.core,
kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._evaluate import CARD_FILE, JSON_FILE, EvaluationError, default_out, evaluate
from ._streams import compare_on_streams

__all__ = ["CARD_FILE", "JSON_FILE", "EvaluationError", "default_out", "evaluate", "compare_on_streams"]
