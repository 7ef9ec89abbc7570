"""NVIDIA kvpress's presses as methods (``kvpress:<name>``): one adapter runs them all inside the model's prefill
(:func:`kvbounds.e2e.compress_kvpress_prefill`), so they are one file; each entry names kvpress's press class."""
from __future__ import annotations

from kvbounds.e2e import compress_kvpress_prefill
from kvbounds.methods import Method

__all__ = ["kvpress_method", "METHODS"]


def kvpress_method(name: str, press: str, **fields) -> Method:
    """The entry ``kvpress:<name>`` running kvpress's class ``press`` (the extra kvbounds[kvpress])."""
    return Method(f"kvpress:{name}", compress_prefill=compress_kvpress_prefill, role="baseline", source="kvpress",
                  press=press, label=f"NVIDIA kvpress's {press}", requires="kvpress", **fields)


METHODS = (
    kvpress_method("streaming_llm", "StreamingLLMPress"),
    kvpress_method("snapkv", "SnapKVPress"),
    kvpress_method("pyramidkv", "PyramidKVPress"),
    kvpress_method("knorm", "KnormPress"),
    kvpress_method("tova", "TOVAPress"),
    kvpress_method("expected_attention", "ExpectedAttentionPress"),
    kvpress_method("random", "RandomPress", randomized=True),
)
