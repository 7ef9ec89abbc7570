"""Streaming KV-cache compression inside generation: presses that keep every layer at a fixed size while tokens
arrive, and their live error bars. See :mod:`kvbounds.presses._streaming.press`."""
from .certificate import ErrorBar
from .generate import generate
from .press import StreamingPress, weighted_output
from .presses import StreamingBalanceKVPress, StreamingSubGenPress

__all__ = ["StreamingPress", "StreamingBalanceKVPress", "StreamingSubGenPress", "generate", "weighted_output",
           "ErrorBar"]
