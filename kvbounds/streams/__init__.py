"""The stream families, one room for the checks, ``kvbounds evaluate`` and kvbounds.testing alike: named KV streams
(``make_stream``) and the power trials' streams with their records.

The families' names and sizes (plain tuples and numbers, :mod:`kvbounds.streams._names`) load with the room; the
streams themselves on first use of a name (PEP 562): the pytest plugin names its fixtures' parameters from here in
every session of an environment where kvbounds is installed, and that must cost no numpy.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.battery, kvbounds.core, kvbounds.traces, kvbounds.algorithms; the layers are a contract
(tests/package/test_structure.py).
"""
from kvbounds import _lazy_face
from typing import TYPE_CHECKING

from ._names import (BATTERY_FAMILIES, FAMILIES, FAMILY_WORDS, MAX_DIM, MAX_TOKENS, REAL,  # noqa: F401
                     REAL_DIM, REAL_TOKENS, SYNTHETIC)

if TYPE_CHECKING:   # what static tools (mypy, jedi) read
    from ._families import KVStream, make_stream, real_available
    from ._prepared import prepare_command, prepare_real, real_prepared
    from ._power import (HELD_OUT, POWER_CHECK, PRACTITIONER, REAL_LAYERS, StreamBattery, battery_record,
                         held_out_errors, missing_record, power_record, power_trials, real_params, real_texts, stream,
                         streams_per_family, window_for)

_NAMES = {name: "._families" for name in ("KVStream", "make_stream", "real_available")}
_NAMES.update({name: "._prepared" for name in ("prepare_command", "prepare_real", "real_prepared")})
_NAMES.update({name: "._power" for name in ("HELD_OUT", "POWER_CHECK", "PRACTITIONER", "REAL_LAYERS", "StreamBattery",
                                            "battery_record", "held_out_errors", "missing_record", "power_record",
                                            "power_trials", "real_params", "real_texts", "stream",
                                            "streams_per_family", "window_for")})

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _lazy_face(__name__, _NAMES)
