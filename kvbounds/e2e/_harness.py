"""The harness: one exact prefill per task instance, shared by every method; compress every layer to a budget;
score the tail through the compressed cache with the weighted attention (:mod:`kvbounds.e2e`).

``run_cell(lm, task, methods, budgets, ...)`` returns one row per (method, budget) plus the exact row
(budget 1.0): the per-target log-likelihoods, greedy correctness, the floats held, and the seconds spent
compressing and scoring. Rows become records in :mod:`kvbounds.proofs_checks.bkv_e2e` / ``sg_e2e`` and in
``kvbounds e2e``; :mod:`kvbounds.e2e` aggregates them.
"""
from __future__ import annotations

import dataclasses
import math
import time
import zlib

import numpy as np

from kvbounds.algorithms.token_selection import memory_floats

from . import _methods as M

EXACT = "exact"


@dataclasses.dataclass
class Prefill:
    """The exact prefill of a context: per layer K, V (1, Hkv, n, d) torch and the attention module's
    inputs (``hidden_states``, ``position_embeddings``, ...) that kvpress's presses read; the time it took.
    ``received`` (when the prefill collected them): per layer the (Hkv, n) attention each key received from the
    prompt's queries (H2O's scores, :func:`kvbounds.e2e._h2o.received_attention`), ``received_s`` of ``seconds``
    spent collecting them, ``received_prefixes`` {m: per-layer scores over the first m queries} for
    :func:`slice_prefill`."""
    n: int
    keys: list
    values: list
    attn_kwargs: list
    seconds: float
    received: list | None = None
    received_s: float = 0.0
    received_prefixes: dict | None = None


def prefill(lm, ids: np.ndarray, *, capture_inputs: bool = True, received: bool = False,
            prefixes: tuple = ()) -> Prefill:
    """The exact prefill of ``ids``. ``received``: collect H2O's scores while it runs (the attention each key
    receives, from the rotated queries the attention kernel reads), also over the first m queries for
    each m in ``prefixes`` (the prompts :func:`slice_prefill` cuts)."""
    import contextlib

    import torch
    from transformers import DynamicCache

    from ._attention import observe_prefill
    model = lm.model
    layers = model.model.layers
    kws: list = [None] * len(layers)
    scores: dict = {}
    spent = [0.0]

    def collect(module, query, key, scaling):
        from ._h2o import received_attention
        t = _now(lm)
        scores[module.layer_idx] = received_attention(query, key, scaling, prefixes=prefixes)
        spent[0] += _now(lm) - t
    hooks = []
    if capture_inputs:
        def hook(l):
            def f(module, args, kwargs):
                kws[l] = {"hidden_states": kwargs["hidden_states"],
                          "position_embeddings": kwargs["position_embeddings"],
                          "cache_position": kwargs.get("cache_position")}
            return f
        hooks = [layer.self_attn.register_forward_pre_hook(hook(l), with_kwargs=True) for l, layer in enumerate(layers)]
    t0 = _now(lm)
    try:
        with torch.no_grad(), (observe_prefill(collect) if received else contextlib.nullcontext()):
            x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=lm.device)[None]
            cache = DynamicCache()
            model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    keys = [cache.layers[l].keys for l in range(len(layers))]
    values = [cache.layers[l].values for l in range(len(layers))]
    seconds = _now(lm) - t0                                           # CPU seconds on CPU, wall on a GPU
    n = int(len(ids))
    got = received and len(scores) == len(layers)     # (a layer not seen: the scores are recomputed when needed)
    return Prefill(n, keys, values, kws, seconds, received=[scores[l][n] for l in range(len(layers))] if got else None,
                   received_s=spent[0], received_prefixes={m: [scores[l][m] for l in range(len(layers))]
                                                           for m in scores[0] if m != n} if got else None)


def slice_prefill(state: Prefill, n: int) -> Prefill:
    """The prefill of the first ``n`` tokens, cut from a longer one (a causal model: the first n positions' keys,
    values and attention inputs do not depend on what follows). One prefill serves both settings of a passkey /
    lines instance: the papers' (question inside the prompt) and ours (question after it), whose prompt is a prefix."""
    if not 0 < n <= state.n:
        raise ValueError(f"cannot cut a prefill of {state.n} tokens to {n}")

    def cut(kw):
        if kw is None:
            return None
        cos, sin = kw["position_embeddings"]
        cp = kw.get("cache_position")
        return {"hidden_states": kw["hidden_states"][:, :n], "position_embeddings": (cos[:, :n], sin[:, :n]),
                "cache_position": None if cp is None else cp[:n]}
    cut_scores = (state.received_prefixes or {}).get(n, state.received if n == state.n else None)
    return Prefill(n, [k[:, :, :n].contiguous() for k in state.keys], [v[:, :, :n].contiguous() for v in state.values],
                   [cut(kw) for kw in state.attn_kwargs], state.seconds,
                   received=None if cut_scores is None else [r[:, :n].contiguous() for r in cut_scores],
                   received_s=state.received_s)


def score_tail(lm, n: int, layers, tail: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Feed ``tail`` at positions n.. after a cache (list of per-layer (K, V, a, b) torch); returns the
    log-likelihood of each of the last len(targets) next tokens and whether the argmax equals it."""
    ll, hit = score_tails(lm, n, batch_layers([layers]), tail, targets)
    return ll[0], hit[0]


def score_tails(lm, n: int, layers, tail: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`score_tail` for a batch of caches (layers' first axis, from :func:`batch_layers`): the same tail
    after each; (batch, len(targets)) log-likelihoods and hits."""
    import torch
    from ._weighted_cache import WeightedCache as Cache
    # the logical length n: a layer holding fewer tokens is read as compressed (the queries' own mask columns at
    # their place), whatever its length next to the other layers' (PyramidKV's per-layer sizes)
    cache = Cache.from_compressed(layers, logical_length=n)
    m, B = len(targets), int(layers[0][0].shape[0])
    with torch.no_grad():
        x = torch.as_tensor(np.asarray(tail, dtype=np.int64), device=lm.device)[None].expand(B, -1)
        pos = torch.arange(n, n + x.shape[1], device=lm.device)[None].expand(B, -1)
        logits = lm.model(input_ids=x, past_key_values=cache, position_ids=pos, use_cache=True,
                          logits_to_keep=m).logits.double()
        lp = torch.log_softmax(logits, -1)
        t = torch.as_tensor(np.asarray(targets, dtype=np.int64), device=lm.device)[None, :, None].expand(B, -1, 1)
        ll = lp.gather(2, t)[..., 0]
        hit = lp.argmax(-1) == t[..., 0]
    return ll.cpu().numpy(), hit.cpu().numpy()


def batch_layers(per_row: list) -> list:
    """Per-layer ``(K, V, a, b)`` of several caches (each batch 1, as from :func:`_to_layers`) stacked along the
    batch axis; a layer's shorter caches are padded with a = b = -inf (padding: no weight on either side), and a
    cache without weights gets a = b = 0 on its real tokens. Attention per row is unchanged (up to rounding)."""
    import torch
    import torch.nn.functional as F
    out = []
    # caches of one length in every layer and row without weights stay plain attention; any other (PyramidKV's
    # per-layer sizes included) goes through the weighted path, which places each layer's own length
    same = len({int(e[0].shape[2]) for row in per_row for e in row}) == 1
    for entries in zip(*per_row):
        M = max(int(e[0].shape[2]) for e in entries)
        plain = same and all(e[2] is None for e in entries)
        split = any(e[2] is not None and e[3] is not e[2] and not torch.equal(e[2], e[3]) for e in entries)
        ks, vs, aa, bb = [], [], [], []
        for K, V, a, b in entries:
            pad = M - int(K.shape[2])
            ks.append(F.pad(K, (0, 0, 0, pad)))
            vs.append(F.pad(V, (0, 0, 0, pad)))
            if not plain:
                a = torch.zeros(K.shape[:3], dtype=torch.float32, device=K.device) if a is None else a
                b = a if b is None else b
                aa.append(F.pad(a, (0, pad), value=-math.inf))
                bb.append(F.pad(b, (0, pad), value=-math.inf))
        a = None if plain else torch.cat(aa)
        out.append((torch.cat(ks), torch.cat(vs), a, None if plain else (torch.cat(bb) if split else a)))
    return out


def _to_layers(lm, compressed):
    """Per layer (K', V', a, b) torch on the model's device in the model's dtype (a, b float32; None when every
    weight is 0, i.e. plain attention), from :class:`CompressedKV` of numpy arrays (copied to the device) or of
    torch tensors (``compress_all(where="device")``: already there, so nothing moves unless the dtype differs)."""
    import torch
    dev = lm.device
    dt = next(lm.model.parameters()).dtype
    out = []
    for c in compressed:
        if isinstance(c.keys, torch.Tensor):
            t = lambda a, dtype=dt: a.to(device=dev, dtype=dtype)[None]
            weighted = not bool(((c.log_w_num == 0).all() & (c.log_w_den == 0).all()).item())
        else:
            t = lambda a, dtype=dt: torch.as_tensor(np.ascontiguousarray(a), device=dev).to(dtype)[None]
            weighted = not (np.all(c.log_w_num == 0) and np.all(c.log_w_den == 0))
        out.append((t(c.keys), t(c.values), t(c.log_w_num, torch.float32) if weighted else None,
                    t(c.log_w_den, torch.float32) if weighted else None))
    return out


def _now(lm) -> float:
    """The harness's clock: CPU seconds of the process (all threads) when the model is on the CPU (robust to other
    load on the machine); on a GPU, wall seconds after the device has finished its queued work (CPU time would
    miss the GPU's)."""
    dev = getattr(lm, "device", None)
    if getattr(dev, "type", "cpu") == "cuda":
        import torch
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    return time.process_time()


def run_cell(lm, task, methods, budgets, *, seed: int = 0, sink: int = 32, window: int = 32,
             state: Prefill | None = None, where: str = "host", redraws: int = 1,
             redraw: tuple = M.RANDOMIZED, extra_budgets: dict | None = None, block_size: int = 64) -> list[dict]:
    """Every (method, budget) on one task instance, sharing one exact prefill; the randomised methods named in
    ``redraw`` (default :data:`kvbounds.e2e._methods.RANDOMIZED`) ``redraws`` times from independent streams (rows
    carry ``draw``). ``extra_budgets``: method -> more budgets for it alone (e.g. uniform at a second budget, the
    checks' sensitivity control).
    A method that fails (or whose package is missing), or holds memory outside
    :data:`kvbounds.e2e._methods.MEMORY_TOLERANCE` of ``budget x exact floats``, gives a row with ``error`` set
    instead of scores. ``where``: compress on the host (numpy,
    the checks' records) or on the model's device (:func:`kvbounds.e2e._methods.compress_all`)."""
    state = state or prefill(lm, task.context, capture_inputs=any(M.needs_inputs(m) for m in methods),
                             received=any(m in M.NEEDS_SCORES for m in methods))
    exact_floats = lm.n_layers * lm.n_kv_heads * state.n * 2 * lm.head_dim
    t0 = _now(lm)
    ll, hit = score_tail(lm, state.n, [(k, v, None, None) for k, v in zip(state.keys, state.values)],
                         task.tail, task.targets)
    rows = [dict(method=EXACT, source="kvbounds", budget=1.0, memory_floats=exact_floats, ll=ll.tolist(),
                 hit=hit.tolist(), compress_s=0.0, score_s=_now(lm) - t0, prefill_s=state.seconds,
                 prefill_scores_s=state.received_s, error="", draw=0)]
    missing = M.kvpress_available()
    plan = [(m, b) for m in methods for b in budgets]
    plan += [(m, b) for m, bs in (extra_budgets or {}).items() for b in bs if (m, b) not in plan]
    todo = []
    for method, budget in plan:
        for draw in range(redraws if method in redraw and method in M.RANDOMIZED else 1):
            row, comp = _method_row(lm, state, method, float(budget), exact_floats, missing, seed=seed, draw=draw,
                                    sink=sink, window=window, where=where, block_size=block_size)
            rows.append(row)
            if comp is not None:
                todo.append((row, comp))
            if len(todo) == SCORE_BATCH:        # at most SCORE_BATCH compressed caches held at once
                _score_rows(lm, task, state.n, todo)
                todo = []
    if todo:
        _score_rows(lm, task, state.n, todo)
    return rows


SCORE_BATCH = 12    # compressed caches scored in one forward pass of the tail (about 2x less CPU than one by one)


def _score_rows(lm, task, n: int, batch: list) -> None:
    """Score the tail after each (row, compressed cache) in one batched forward pass (:func:`batch_layers`),
    filling the rows' ``ll``, ``hit`` and ``score_s`` (the batch's seconds shared equally); if the batch fails,
    row by row, so a failing cache is that row's ``error``."""
    t0 = _now(lm)
    try:
        ll, hit = score_tails(lm, n, batch_layers([_to_layers(lm, c) for _, c in batch]), task.tail, task.targets)
    except Exception:   # noqa: BLE001 - retried row by row below, where each error is kept with its row
        ll = None
    if ll is None or len(batch) == 1:
        for row, comp in batch:
            t1 = _now(lm)
            try:
                r_ll, r_hit = score_tail(lm, n, _to_layers(lm, comp), task.tail, task.targets)
            except Exception as e:   # noqa: BLE001 - one method failing is a row with its error, not a crash
                row.update(error=f"{type(e).__name__}: {e}"[:300])
                continue
            row.update(ll=r_ll.tolist(), hit=r_hit.tolist(), score_s=_now(lm) - t1)
        return
    each = (_now(lm) - t0) / len(batch)
    for (row, _), r_ll, r_hit in zip(batch, ll, hit):
        row.update(ll=r_ll.tolist(), hit=r_hit.tolist(), score_s=each)


def _method_row(lm, state, method: str, budget: float, exact_floats: int, missing: str | None, *, seed: int,
                draw: int, sink: int, window: int, where: str, block_size: int = 64) -> tuple[dict, list | None]:
    """(row, compressed cache) of one method at one budget; the cache is None (and ``error`` set) when the method
    fails, its package is missing, or it holds memory outside the tolerance."""
    row = dict(method=method, source=M.source(method), budget=budget, error="", draw=draw)
    if method.startswith("kvpress:") and missing:
        return dict(row, error=missing), None
    # one stream per (seed, method, budget, draw): adding or removing a method changes no other method's draws
    rng = np.random.default_rng([seed, zlib.crc32(method.encode()), int(round(budget * 1e6)), draw])
    try:
        t0 = _now(lm)
        comp = M.compress_all(method, lm, state, budget, rng, sink=sink, window=window, seed=seed + 7919 * draw,
                              where=where, block_size=block_size)
        t1 = _now(lm)
        held = int(sum(memory_floats(c) for c in comp))
    except Exception as e:   # noqa: BLE001 - one method failing is a row with its error, not a crash
        return dict(row, error=f"{type(e).__name__}: {e}"[:300]), None
    target = budget * exact_floats
    stored = max(int(c.keys.shape[-2]) for c in comp)
    if stored > state.n:        # e.g. SubGen near the whole cache: its split cache holds more entries than tokens
        return dict(row, memory_floats=held, error=f"not attainable: at this memory {method} stores {stored} entries "
                    f"per head, more than the {state.n} tokens they stand for"), None
    if not (1 - M.MEMORY_TOLERANCE) * target <= held <= (1 + M.MEMORY_TOLERANCE) * target:
        return dict(row, memory_floats=held, error=f"unequal memory: holds {held / target:.2%} of the target "
                    f"{target:.0f} floats (tolerance {M.MEMORY_TOLERANCE:.0%})"), None
    row.update(memory_floats=held, compress_s=t1 - t0)
    return row, comp
