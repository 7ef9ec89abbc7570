"""Streaming KV-cache compression inside generation (issue 23): presses that keep every layer at a fixed size while
tokens arrive, and their live error certificates. See :mod:`kvbounds.streaming.press`."""
from .press import StreamingBalanceKVPress, StreamingPress, StreamingSubGenPress, generate, weighted_output

__all__ = ["StreamingPress", "StreamingBalanceKVPress", "StreamingSubGenPress", "generate", "weighted_output"]
