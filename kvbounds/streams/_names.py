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
# each family in one line (the evaluation card explains the synthetic families with these)
FAMILY_WORDS = {
    "synthetic benign": "random unit-direction keys and queries, logits of size at most 1: every token matters a "
                        "little (uniform sampling's home ground)",
    "concentrated": "4 heavy tokens in the first tenth carry most of each query's attention, the rest in tight "
                    "clusters (a method must find and keep the heavy tokens)",
    "clustered": "keys in 8 tight clusters (spread 0.05): a few representatives stand for many tokens",
    "low rank": "keys and values of rank 4 plus 1% noise: a projection loses almost nothing",
    "rope": "rank-8 keys rotated by RoPE (theta 1e4), as a decoder's keys are",
    "outlier channels": "2 channels of the keys and queries much larger than the others, as in real models",
    "huge norms": "very large key norms: a near-diagonal exponential kernel, each query attends to one token",
    "duplicated keys": "each key repeated many times: a weighted cache needs one copy per distinct key",
    "real SmolLM2": "one (layer, head) of SmolLM2-135M's post-RoPE queries, keys and values on real text (a "
                    "window of the cached trace)",
    "real MiniLM": "one (layer, head) of all-MiniLM-L6-v2's queries, keys and values on real text",
}
