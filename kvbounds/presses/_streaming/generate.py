"""Greedy generation with a streaming press: the prompt fed in chunks of at most the press's interval, so no layer
ever holds more than ``target + interval`` tokens, padding honoured row by row."""
from __future__ import annotations

import inspect

import torch

from . import inputs


def cache_keyword(model) -> str:
    """The name a model's forward takes its cache by: ``past_key_values`` (transformers 5.2) or ``cache`` (later)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def generate(model, press, input_ids, max_new_tokens: int, *, chunk: int | None = None, attention_mask=None):
    """Greedy generation with ``press`` (a streaming press) on ``model`` (on the weighted attention): the prompt fed
    in chunks of ``chunk`` tokens (default and at most: the press's interval), so no layer ever holds more than
    target + interval tokens, then one token per step. Returns the (b, n + max_new_tokens) token ids: the input
    ids as given, then each row's new tokens.

    ``attention_mask`` (b, n) of 0/1 (left or right padding, one block of tokens per row): each row is generated
    from its own tokens alone, as it would be alone (rows of equal length run together, one batch per length; each
    row draws from its own random stream), so a padded row's tokens equal the row's alone. The press's state
    afterwards is the last batch's."""
    chunk, mask = inputs.check_generate(model, press, input_ids, max_new_tokens, chunk, attention_mask)
    from kvbounds.e2e import require_weighted_attention
    require_weighted_attention(model)
    if mask is None or bool(mask.all()):
        new = _generate_rows(model, press, input_ids, max_new_tokens, chunk)
        return torch.cat([input_ids, new], 1)
    new = torch.zeros(input_ids.shape[0], max_new_tokens, dtype=torch.long, device=input_ids.device)
    lengths = mask.sum(1)
    for n in sorted(set(int(x) for x in lengths)):
        rows = torch.nonzero(lengths == n)[:, 0]
        ids = torch.stack([input_ids[r][mask[r]] for r in rows.tolist()])
        new[rows] = _generate_rows(model, press, ids, max_new_tokens, chunk)
    return torch.cat([input_ids, new], 1)


def _generate_rows(model, press, ids, max_new_tokens: int, chunk: int):
    from transformers import DynamicCache
    cache, key = DynamicCache(), cache_keyword(model)
    kw = {key: cache, "use_cache": True}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kw["logits_to_keep"] = 1                 # only the last position's logits are read
    out = []
    with torch.no_grad(), press(model):
        for i in range(0, ids.shape[1], chunk):
            logits = model(input_ids=ids[:, i:i + chunk], **kw).logits
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            logits = model(input_ids=nxt, **kw).logits
    return torch.cat(out, 1) if out else ids.new_zeros(ids.shape[0], 0)
