"""The method registry: one entry per KV-cache compression method, the one place a method is named (its compressor,
ablation, press and words).

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._registry import (Method, VARIANT_WORDS, get_method, leaderboard_family, method_table, methods, names,
                        press_method, register, variant_words, variants)
