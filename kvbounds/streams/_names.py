"""The names and sizes of the KV stream families (:mod:`kvbounds.streams._families` builds the streams): plain tuples
and numbers, so that the pytest plugin can name its fixtures' parameters without importing numpy."""
from __future__ import annotations

SYNTHETIC = ("synthetic benign", "concentrated", "clustered", "low rank", "rope", "outlier channels", "huge norms",
             "duplicated keys")
REAL = ("real SmolLM2", "real MiniLM")
FAMILIES = SYNTHETIC + REAL
# the families of the battery (kvbounds evaluate): the synthetic four and the two real models
BATTERY_FAMILIES = ("synthetic benign", "concentrated", "clustered", "low rank") + REAL
REAL_DIM = {"real SmolLM2": 64, "real MiniLM": 32}
# a real stream reads one distinct text (kvbounds.traces.corpus), at most the longest window of one
# (kvbounds.streams.WINDOWS; MiniLM's texts at its shorter window)
REAL_TOKENS = {"real SmolLM2": 1056, "real MiniLM": 544}
DRAWN_TEXTS = 4            # a real stream without a unit reads one of the corpus's first texts, drawn from its seed
MAX_TOKENS, MAX_DIM = 10**6, 4096
