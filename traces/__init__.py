"""Attention traces (Q, K, V) shared by every family: synthetic generators here, real-model traces later."""
from .synthetic import Trace, GENERATORS, make_trace

__all__ = ["Trace", "GENERATORS", "make_trace"]
