"""The end-to-end methods' names (no imports: the CLI builds its parser from them without loading the
compressors)."""

# run by kvbounds' own code (kernel_thinning: a baseline through goodpoints, the optional extra kvbounds[kt]; without
# it its rows are skipped with the install command)
OURS = ("streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen",
        "subspace", "h2o", "kernel_thinning")
PRESSES = {"streaming_llm": "StreamingLLMPress", "snapkv": "SnapKVPress", "pyramidkv": "PyramidKVPress",
           "knorm": "KnormPress", "tova": "TOVAPress", "expected_attention": "ExpectedAttentionPress",
           "random": "RandomPress"}
KVPRESS = tuple(f"kvpress:{p}" for p in PRESSES)
# the end-to-end checks' null control: uniform sampling again, from its own random stream (the harness seeds each
# method separately), so "better than uniform" must not be found for it
CONTROLS = ("uniform_control",)
DEFAULT_METHODS = OURS + CONTROLS + KVPRESS
# methods that read the prefill's captured attention inputs (queries), not only K and V
NEEDS_INPUTS = ("h2o",)
# methods that read the attention each key received from the prompt's queries, collected during the prefill
# (harness.prefill(received=True); without it they recompute it from the captured inputs)
NEEDS_SCORES = ("h2o",)
# the quick profile's list: what the verdicts of BKV.e2e / SG.e2e need (ours, the papers' baselines, the null
# control); `full` and `kvbounds e2e` run every press
QUICK_METHODS = ("balancekv", "balancekv_released", "kcenter", "kcenter_sized", "subgen", "uniform",
                 "uniform_control", "streaming_llm", "h2o", "kvpress:snapkv", "kvpress:pyramidkv")
# methods whose cache depends on a random draw: the checks redraw them (robustness to the method's randomness)
RANDOMIZED = ("uniform", "uniform_control", "balancekv", "balancekv_released", "subgen", "kvpress:random",
              "kernel_thinning")
