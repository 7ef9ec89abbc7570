"""streaming_llm: StreamingLLM (Xiao et al. 2023), the first ``sink`` tokens and the most recent ones."""
from __future__ import annotations

from kvbounds.algorithms import token_selection as ts
from kvbounds.methods import Method

__all__ = ["compress", "METHOD"]


def compress(K, V, floats: int, rng, *, sink: int, window: int, block_size: int = 64, Q=None):
    """StreamingLLM: the first ``sink`` tokens and the most recent ones, as many as fit; weights 1."""
    return ts.StreamingLLM(sink=sink).compress(K, V, budget=floats // (2 * K.shape[-1]))


METHOD = Method("streaming_llm", compress, role="baseline",
                label="StreamingLLM: the first sink tokens and the most recent ones (Xiao et al. 2023)")
