"""The end-to-end methods' names (no imports: the CLI builds its parser from them without loading the
compressors)."""

OURS = ("streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen",
        "subspace")
PRESSES = {"streaming_llm": "StreamingLLMPress", "snapkv": "SnapKVPress", "pyramidkv": "PyramidKVPress",
           "knorm": "KnormPress", "tova": "TOVAPress", "expected_attention": "ExpectedAttentionPress",
           "random": "RandomPress"}
KVPRESS = tuple(f"kvpress:{p}" for p in PRESSES)
# the end-to-end checks' null control: uniform sampling again, from its own random stream (the harness seeds each
# method separately), so "better than uniform" must not be found for it
CONTROLS = ("uniform_control",)
DEFAULT_METHODS = OURS + CONTROLS + KVPRESS
