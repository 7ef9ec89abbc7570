"""The method registry: one entry per KV-cache compression method, the one place a method is named (its compressor,
ablation, press and words). The methods themselves are the modules of kvbounds.catalog, imported on first use.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import
kvbounds.algorithms; the layers are a contract (tests/package/test_structure.py).
"""
from ._registry import (CATALOG, VARIANT_WORDS, Method, get_method, leaderboard_family, load_entry_points,
                        method_table, methods, module_methods, names, press_method, register, variant_words, variants)

__all__ = ["CATALOG", "VARIANT_WORDS", "Method", "get_method", "leaderboard_family", "load_entry_points",
           "method_table", "methods", "module_methods", "names", "press_method", "register", "variant_words",
           "variants"]
