"""The argument checks of :mod:`kvbounds.presses` (docs/INPUTS.md, "Streaming presses"): every refusal an
:class:`~kvbounds.algorithms.validation.InputError` naming the argument and the rule, before any work."""
from __future__ import annotations

import math

import numpy as np
import torch

from kvbounds.algorithms.validation import InputError


def count(name: str, v, *, low: int = 0) -> int:
    """An integer (Python or numpy, not bool) >= ``low``."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise InputError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(scale)) or float(scale) <= 0:
        raise InputError(f"scale must be a finite positive number (the attention's logit scale), got {scale!r}")
    return float(scale)


def check_query(layer, q, scale) -> None:
    """q (b, H, d): a finite real float torch tensor matching the layer's rows and head_dim, H a multiple of its KV
    heads; ``layer`` a WeightedLayer holding at least one token; a valid ``scale``."""
    from kvbounds.e2e import WeightedLayer
    if not isinstance(layer, WeightedLayer):
        raise InputError(f"layer must be a kvbounds WeightedLayer (a streaming press's cache layer), got "
                         f"{type(layer).__name__}")
    if layer.keys is None or not layer.is_initialized or layer.keys.shape[-2] == 0:
        raise InputError("layer holds no tokens: there is no attention output to bound")
    if not isinstance(q, torch.Tensor):
        raise InputError(f"q must be a torch tensor (batch, query heads, head_dim), got {type(q).__name__}")
    if not q.is_floating_point() or q.dtype in (torch.float16, torch.bfloat16):
        raise InputError(f"q must be a float32 or float64 tensor, got {q.dtype}")
    b, Hkv, _, d = layer.keys.shape
    if q.ndim != 3 or q.shape[0] != b or q.shape[2] != d or q.shape[1] < 1 or q.shape[1] % Hkv:
        raise InputError(f"q must have shape (batch = {b}, query heads (a multiple of the {Hkv} KV heads), "
                         f"head_dim = {d}), got {tuple(q.shape)}")
    if not bool(torch.isfinite(q).all()):
        raise InputError("q contains NaN or inf")
    check_scale(scale)


def check_kind(kind) -> str:
    from .certificate import KINDS
    if not isinstance(kind, str) or kind not in KINDS:
        raise InputError(f"kind must be one of {KINDS} (a bound valid for every input, or a statistical estimate), "
                         f"got {kind!r}")
    return kind


def check_layer_index(press, layer_idx) -> int:
    n = len(press._layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, (int, np.integer)) or not 0 <= layer_idx < max(n, 1):
        raise InputError(f"layer_idx must be an integer in [0, {n}) (the press's layers), got {layer_idx!r}")
    if n == 0:
        raise InputError("the press holds no cache yet: run the model inside its context first")
    return int(layer_idx)


def check_layer_query(press, layer_idx, layer, q, scale) -> None:
    """``layer`` must be the press's own layer ``layer_idx`` (its state is per layer) and q a valid query."""
    i = check_layer_index(press, layer_idx)
    if layer is not press._layers[i]:
        raise InputError(f"layer is not this press's layer {i} (a certificate reads the press's state for that "
                         "layer of its current cache)")
    check_query(layer, q, scale)


def check_generate(model, press, input_ids, max_new_tokens, chunk, attention_mask):
    """generate()'s arguments -> (chunk, mask (b, n) bool or None)."""
    from .press import StreamingPress
    if not isinstance(press, StreamingPress):
        raise InputError(f"press must be a streaming press (StreamingBalanceKVPress, StreamingSubGenPress), got "
                         f"{type(press).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long \
            or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise InputError("input_ids must be a non-empty (batch, tokens) torch.long tensor, got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and (int(input_ids.min()) < 0 or int(input_ids.max()) >= int(vocab)):
        raise InputError(f"input_ids must lie in [0, {vocab}) (the model's vocabulary), got "
                         f"{int(input_ids.min())}..{int(input_ids.max())}")
    count("max_new_tokens", max_new_tokens)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if context is not None and input_ids.shape[1] + int(max_new_tokens) > int(context):
        raise InputError(f"input_ids ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceed the "
                         f"model's context ({context} positions, config.max_position_embeddings)")
    chunk = press.interval if chunk is None else count("chunk", chunk, low=1)
    if chunk > press.interval:
        raise InputError(f"chunk = {chunk} must be at most the press's interval = {press.interval}: the bound "
                         "target + interval holds for chunks of at most interval tokens")
    if attention_mask is None:
        return chunk, None
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise InputError(f"attention_mask must be a torch tensor of input_ids' shape {tuple(input_ids.shape)}, got "
                         f"{tuple(getattr(attention_mask, 'shape', ()))}")
    if attention_mask.is_floating_point() or attention_mask.is_complex() \
            or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise InputError("attention_mask must hold 0 (padding) and 1 (token) as integers or bools")
    mask = attention_mask.bool()
    for r in range(mask.shape[0]):
        idx = torch.nonzero(mask[r])[:, 0]
        if idx.numel() == 0:
            raise InputError(f"attention_mask row {r} has no token (every position is padding)")
        if int(idx[-1] - idx[0]) + 1 != idx.numel():
            raise InputError(f"attention_mask row {r} is not one block of tokens (padding inside the row): only "
                             "left or right padding is supported")
    return chunk, mask
