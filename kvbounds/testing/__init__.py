"""Testing a KV-cache compressor in your own pytest suite: KV streams from named families
(:mod:`kvbounds.streams`), hypothesis strategies of them (:mod:`kvbounds.testing.strategies`),
assertions with readable messages (:mod:`kvbounds.testing`) and the pytest plugin ``kvbounds``
(:mod:`kvbounds.testing.plugin`: the ``kv_stream`` and ``real_trace`` fixtures, ``--kvbounds-profile``, the
``kvbounds_slow`` marker). docs/TESTING.md has an example suite.

Importing this package imports numpy only; ``strategies`` needs hypothesis (``pip install 'kvbounds[testing]'``).
Its modules ``strategies`` and ``plugin`` are public (the plugin is an entry point), the assertions private behind this
__init__. It may import kvbounds.evaluation, kvbounds.streams, kvbounds.battery and kvbounds.algorithms; the layers
are a contract (tests/package/test_structure.py).
"""
from kvbounds.streams import BATTERY_FAMILIES, FAMILIES, KVStream, make_stream, real_available

from ._assertions import SCALES, assert_attention_error, assert_beats, attention_error

__all__ = ["KVStream", "make_stream", "real_available", "FAMILIES", "BATTERY_FAMILIES", "SCALES",
           "assert_attention_error", "assert_beats", "attention_error"]
