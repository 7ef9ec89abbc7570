"""Regression tests of issue 24 on the rewritten end-to-end layer (weighted attention on SDPA, WeightedCache, the
equal-memory budget solver and compress functions): each defect the long fuzz (tests/fuzz/test_fuzz.py -m fuzz) found
there, with the answer it must now give (the right value, or an InputError naming the argument and the rule)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds.algorithms.validation import InputError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _qkv(L=2, M=5, d=3, dv=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, L, d, generator=g, dtype=dtype), torch.randn(1, 2, M, d, generator=g, dtype=dtype),
            torch.randn(1, 2, M, dv, generator=g, dtype=dtype))


def _bottom_right_reference(q, k, v, logw):
    L, M = q.shape[2], k.shape[2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + logw[:, :, None, :]
    logits = logits.masked_fill(~torch.ones(L, M, dtype=torch.bool).tril(M - L), -math.inf)
    return torch.softmax(logits, -1) @ v


def test_weighted_sdpa_computes_in_the_inputs_dtype_and_at_the_values_width():
    from kvbounds.e2e._attention import weighted_sdpa
    q, k, v = _qkv(dv=2)
    a = torch.tensor([0.0, math.log(2), 0.0, 0.0, 0.0], dtype=torch.float64).expand(1, 2, 5)
    b = torch.tensor([0.0, 0.0, -math.inf, 0.0, 0.0], dtype=torch.float64).expand(1, 2, 5)
    torch.testing.assert_close(weighted_sdpa(q, k, v, a, a), _bottom_right_reference(q, k, v, a), rtol=1e-12, atol=1e-14)
    num = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(3) + a[:, :, None].masked_fill(
        ~torch.ones(2, 5, dtype=torch.bool).tril(3), -math.inf), -1)
    den = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(3) + b[:, :, None]).masked_fill(
        ~torch.ones(2, 5, dtype=torch.bool).tril(3), 0)
    want = (num @ v) * torch.exp(torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(3) + a[:, :, None].masked_fill(
        ~torch.ones(2, 5, dtype=torch.bool).tril(3), -math.inf), -1))[..., None] / den.sum(-1)[..., None]
    torch.testing.assert_close(weighted_sdpa(q, k, v, a, b), want, rtol=1e-12, atol=1e-14)   # split, dv = 2 != d


@pytest.mark.parametrize("bad, match", [
    (dict(lw=float("nan")), "log_w_num contains NaN"), (dict(lw=float("inf")), "log_w_num contains NaN or \\+inf"),
    (dict(key=float("nan")), "key contains NaN"), (dict(query=float("inf")), "query contains NaN"),
    (dict(dtype=torch.complex128), "real floating-point"), (dict(mixed=True), "share one dtype"),
    (dict(aslist=True), "must be a torch tensor"), (dict(den=-math.inf), "denominator is empty")])
def test_weighted_sdpa_refuses_bad_input_by_name(bad, match):
    from kvbounds.e2e._attention import weighted_sdpa
    q, k, v = _qkv()
    a, b = torch.zeros(1, 2, 5, dtype=torch.float64), torch.zeros(1, 2, 5, dtype=torch.float64)
    if "lw" in bad:
        a[0, 0, 1] = bad["lw"]
    if "key" in bad:
        k[0, 1, 0, 0] = bad["key"]
    if "query" in bad:
        q[0, 0, 0, 1] = bad["query"]
    if "dtype" in bad:
        q, k, v = (x.to(bad["dtype"]) for x in (q, k, v))
    if "mixed" in bad:
        q = q.float()
    if "den" in bad:
        b[0, 1, :] = bad["den"]
        b[0, 1, -2:] = -math.inf
    with pytest.raises(InputError, match=match):
        weighted_sdpa(q, k, v, a.tolist() if "aslist" in bad else a, b)


def test_weighted_attention_forward_without_a_mask_places_the_queries_last():
    """A maskless call with 1 < L < M and no weights went to SDPA's is_causal (top-left aligned): query i saw
    keys 0..i instead of 0..M-L+i. transformers never passes such a call; the fuzz did."""
    from kvbounds.e2e._attention import weighted_attention_forward
    q, k, v = _qkv()
    out = weighted_attention_forward(None, q, k, v, None)[0]
    torch.testing.assert_close(out.transpose(1, 2), _bottom_right_reference(q, k, v, torch.zeros(1, 2, 5)))
    with pytest.raises(InputError, match="query must be a torch tensor"):
        weighted_attention_forward(None, q.tolist(), k, v, None)


def test_weighted_cache_refuses_list_weights_and_non_finite_keys():
    from kvbounds.e2e._attention import WeightedCache
    _, k, v = _qkv()
    with pytest.raises(InputError, match="log_w_num must be a torch tensor"):
        WeightedCache([(k, v, torch.zeros(1, 2, 5).tolist(), torch.zeros(1, 2, 5))])
    k[0, 0, 0, 0] = math.nan
    with pytest.raises(InputError, match="keys must be .* finite"):
        WeightedCache([(k, v, None, None)])


@pytest.mark.parametrize("call, match", [
    (lambda M: M.balance_levels(16, 4, 10**30, 1, 100), "sink \\+ window"),
    (lambda M: M.balance_levels(16, 4, 1, math.inf, 100), "window must be an integer"),
    (lambda M: M.balance_levels(16, 4, 1, 1, math.nan), "floats must be an integer"),
    (lambda M: M.balance_budgets("64", 4), "n must be an integer"),
    (lambda M: M.balance_budgets(64, 4, levels=0), "levels must be a sequence"),
    (lambda M: M.compress_ours("uniform", np.zeros(()), np.zeros(()), 120, np.random.default_rng(0), sink=1,
                               window=1), "K must be a \\(KV heads, tokens, head_dim\\)"),
    (lambda M: M.compress_ours("balancekv", *np.ones((2, 2, 16, 4)), None, np.random.default_rng(0), sink=1,
                               window=1), "floats must be an integer"),
    (lambda M: M.compress_ours("balancekv", *np.ones((2, 2, 16, 4)), math.nan, np.random.default_rng(0), sink=1,
                               window=1), "floats must be an integer"),
    (lambda M: M.compress_layer("uniform", *np.ones((2, 2, 16, 4)), math.nan, np.random.default_rng(0), sink=1,
                                window=1), "budget must be a number in \\(0, 1\\]"),
    (lambda M: M.source(3), "method must be a method name"), (lambda M: M.runs_on(None), "method must be"),
    (lambda M: M.path_note(1.5), "method must be")])
def test_budget_solver_and_compress_functions_refuse_by_name(call, match):
    from kvbounds.e2e import _methods as M
    with pytest.raises(InputError, match=match):
        call(M)
