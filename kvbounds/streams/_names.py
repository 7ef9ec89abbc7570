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
REAL_TOKENS = {"real SmolLM2": 2048, "real MiniLM": 512}
MAX_TOKENS, MAX_DIM = 10**6, 4096
