"""Tiny randomly initialised causal LMs of the two architectures the end-to-end harness runs (no download): Llama
(SmolLM2's) and Qwen2 (Qwen2.5-Coder-0.5B's: q/k/v projections with biases, an untied output projection, GQA)."""
from __future__ import annotations

ARCHS = ("llama", "qwen2")


def tiny_causal_lm(arch: str = "llama", attn: str | None = None, **cfg):
    """A model of ``arch`` from LlamaConfig-style keyword arguments (the same names serve Qwen2Config); ``attn``:
    the attention implementation set on the config before the model is built."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    if arch == "llama":
        config, model = LlamaConfig(**cfg), LlamaForCausalLM
    elif arch == "qwen2":
        config, model = Qwen2Config(tie_word_embeddings=False, **cfg), Qwen2ForCausalLM
    else:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if attn is not None:
        config._attn_implementation = attn
    return model(config).eval()
