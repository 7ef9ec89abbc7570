"""The stream families, one room for the checks, ``kvbounds evaluate`` and kvbounds.testing alike: named KV streams
(``make_stream``) and the power trials' streams with their records.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.battery, kvbounds.core, kvbounds.traces, kvbounds.algorithms; the layers are a contract
(tests/package/test_structure.py).
"""
from ._families import (BATTERY_FAMILIES, FAMILIES, KVStream, REAL, REAL_TOKENS, SYNTHETIC, make_stream,
                        real_available)
from ._power import (POWER_CHECK, StreamBattery, battery_record, missing_record, power_record, power_trials,
                     real_params, stream, streams_per_family)
