"""Attention traces (Q, K, V) shared by every family: synthetic generators here, real-model traces later."""
if __name__ != "kvbounds.traces":   # the subpackage kvbounds.traces (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.traces, not {__name__}: the folder traces/ is a subpackage of kvbounds")
from .synthetic import Trace, GENERATORS, make_trace

__all__ = ["Trace", "GENERATORS", "make_trace"]
