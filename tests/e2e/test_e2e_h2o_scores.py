"""H2O's scores collected during the exact prefill (issue 26: H2O's compression is then its top-k only). The
collected scores are the recomputed ones (the same function of the same rotated queries and keys), close to the
plain n x n softmax they replace, and the prefill's caches do not change by collecting them."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _plain_scores(q, k, scale):
    """The code before issue 26: one masked n x n softmax per KV group, summed over its queries and query heads."""
    H, n, d = q.shape[1:]
    Hkv = k.shape[1]
    qg = q[0].reshape(Hkv, H // Hkv, n, d)
    lg = torch.einsum("hgqd,hkd->hgqk", qg, k[0]) * scale
    w = torch.softmax(lg.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf), -1)
    return w.sum(dim=(1, 2))


@pytest.mark.parametrize("n,H,Hkv", [(1, 2, 1), (95, 6, 2), (97, 4, 4), (250, 9, 3)])
def test_received_attention_is_the_plain_softmax_column_sum(n, H, Hkv):
    from kvbounds.e2e._h2o import received_attention
    g = torch.Generator().manual_seed(n)
    q, k = torch.randn(1, H, n, 16, generator=g) * 2, torch.randn(1, Hkv, n, 16, generator=g) * 2
    cuts = (1, n // 2, 96, n - 1)
    got = received_attention(q, k, 0.25, prefixes=cuts)
    # float32 sums of <= 9 n softmax weights in another order: relative 1e-5 is ~100 ulps at n = 250
    torch.testing.assert_close(got[n], _plain_scores(q, k, 0.25), rtol=1e-5, atol=1e-6)
    assert math.isclose(float(got[n].sum()), H * n, rel_tol=1e-5)          # every query's weights sum to 1
    for m in cuts:
        if 0 < m < n:
            ref = _plain_scores(q[:, :, :m], k[:, :, :m], 0.25)
            torch.testing.assert_close(got[m][:, :m], ref, rtol=1e-5, atol=1e-6)
            assert not got[m][:, m:].any()                                  # keys after the prefix: no query saw them
    assert torch.equal(received_attention(q, k, 0.25)[n], got[n])          # prefixes do not change the full sums


def test_received_attention_refuses_other_shapes_by_name():
    from kvbounds.algorithms.validation import InputError
    from kvbounds.e2e._h2o import received_attention
    with pytest.raises(InputError, match="query"):
        received_attention(np.zeros((1, 2, 4, 8)), torch.zeros(1, 1, 4, 8))
    with pytest.raises(InputError, match="multiple"):
        received_attention(torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8))
    with pytest.raises(InputError, match="callable"):
        from kvbounds.e2e._attention import observe_prefill
        with observe_prefill(None):
            pass


def test_prefill_collects_the_recomputed_scores_without_changing_the_cache(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import _methods as M
    from kvbounds.e2e._h2o import accumulated_attention
    ids = tasks.ppl_task(lm, 200, 2, 0).context
    plain = harness.prefill(lm, ids)
    got = harness.prefill(lm, ids, received=True, prefixes=(150,))
    assert plain.received is None and got.received is not None and got.received_s > 0
    for l, layer in enumerate(lm.model.model.layers):
        assert torch.equal(got.keys[l], plain.keys[l]) and torch.equal(got.values[l], plain.values[l])
        with torch.no_grad():
            assert torch.equal(got.received[l], accumulated_attention(layer.self_attn, plain.attn_kwargs[l],
                                                                      plain.keys[l]))
    for st, ref in ((got, plain), (harness.slice_prefill(got, 150), harness.slice_prefill(plain, 150))):
        assert st.received is not None and ref.received is None
        a = M.compress_all("h2o", lm, st, 0.3, np.random.default_rng(0), sink=16, window=16)
        b = M.compress_all("h2o", lm, ref, 0.3, np.random.default_rng(0), sink=16, window=16)   # recomputed
        for x, y in zip(a, b):
            assert np.array_equal(x.keys, y.keys) and np.array_equal(x.values, y.values)
