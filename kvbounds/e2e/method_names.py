"""The end-to-end methods' names (no imports: the CLI builds its parser from them without loading the
compressors)."""

OURS = ("streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen",
        "subspace")
PRESSES = {"streaming_llm": "StreamingLLMPress", "snapkv": "SnapKVPress", "pyramidkv": "PyramidKVPress",
           "knorm": "KnormPress", "tova": "TOVAPress", "expected_attention": "ExpectedAttentionPress",
           "random": "RandomPress"}
KVPRESS = tuple(f"kvpress:{p}" for p in PRESSES)
DEFAULT_METHODS = OURS + KVPRESS
