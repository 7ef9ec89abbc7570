"""The command line: ``kvbounds list | show | check | report | evaluate | e2e | traces``, one module per command family.

Its modules are private (a leading underscore); this __init__ names what the room offers. It may import any room of
kvbounds (it is the top); the layers are a contract (tests/package/test_structure.py).
"""
from ._main import main

__all__ = ["main"]
