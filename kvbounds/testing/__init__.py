"""Testing a KV-cache compressor in your own pytest suite: KV streams from named families
(:mod:`kvbounds.streams`), hypothesis strategies of them (:mod:`kvbounds.testing.strategies`),
assertions with readable messages (this package) and the pytest plugin ``kvbounds``
(:mod:`kvbounds.testing.plugin`: the ``kvbounds_stream`` and ``kvbounds_real_trace`` fixtures,
``--kvbounds-profile``, the ``kvbounds_slow`` marker). docs/TESTING.md has an example suite.

The names below are imported on first use (PEP 562): pytest loads the plugin in every session of an environment
where kvbounds is installed, and importing this package for it must cost no numpy. Using them imports numpy only;
``strategies`` needs hypothesis (``pip install 'kvbounds[testing]'``).

Its modules ``strategies`` and ``plugin`` are public (the plugin is an entry point), the assertions private behind this
__init__. It may import kvbounds.evaluation, kvbounds.streams, kvbounds.battery and kvbounds.algorithms; the layers
are a contract (tests/package/test_structure.py).
"""
from kvbounds import _lazy_face

__all__ = ["KVStream", "make_stream", "real_available", "FAMILIES", "BATTERY_FAMILIES", "SCALES",
           "assert_attention_error", "assert_beats", "attention_error"]
_HOME = {"KVStream": "kvbounds.streams", "make_stream": "kvbounds.streams", "real_available": "kvbounds.streams",
         "FAMILIES": "kvbounds.streams", "BATTERY_FAMILIES": "kvbounds.streams", "SCALES": f"{__name__}._assertions",
         "assert_attention_error": f"{__name__}._assertions", "assert_beats": f"{__name__}._assertions",
         "attention_error": f"{__name__}._assertions"}

__getattr__, __dir__ = _lazy_face(__name__, _HOME)
