"""The blockwise walk's pieces (kvbounds.algorithms.block_walk) on every backend against numpy: the block Gram
within the dtype's tolerance, the same signs and FAIL flags from the same uniforms (panel walk and its stepwise
reference), the same walk diagnostic; outputs on the input's device."""
import numpy as np
import pytest

from backend_helpers import assert_close, assert_equal, assert_on_device_of
from kvbounds.algorithms.block_walk import block_gram, panel_walk, panel_walk_stepwise, walk_diagnostic
from kvbounds.algorithms.arrays import asarray


def _blocks(seed, lead=(2, 3), b=64, d=6, e=3, pad=0):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal(lead + (b, d)) * 0.4
    W = rng.standard_normal(lead + (b, e))
    ones = None
    if pad:                                        # padded rows at the end of the last block, as a level makes them
        ones = np.ones(lead[-1:] + (b,))
        ones[-1, b - pad:] = 0.0
        K[..., -1, b - pad:, :] = W[..., -1, b - pad:, :] = 0.0
    nk2 = (K ** 2).sum(-1)
    nw2 = (W ** 2).sum(-1) + (1.0 if ones is None else ones)
    return K, W, nk2, nw2, rng.random(lead + (b,)), ones


def test_block_gram_agrees_with_numpy(backend):
    K, W, *_ = _blocks(0)
    G = block_gram(asarray(K, backend), asarray(W, backend), scale=0.5)
    assert_on_device_of(G, asarray(K, backend))
    assert_close(G, block_gram(K, W, scale=0.5))


@pytest.mark.parametrize("pad", [0, 5])
@pytest.mark.parametrize("c", [0.5, 60.0])
def test_walks_give_numpy_signs(backend, pad, c):
    K, W, nk2, nw2, u, ones = _blocks(1, pad=pad)
    args = (K, W, nk2, nw2, u)
    argsb = tuple(asarray(x, backend) for x in args)
    ob = None if ones is None else asarray(ones, backend)
    for walk in (panel_walk, panel_walk_stepwise):
        ref_s, ref_f = walk(*args, c, plus_one=True, ones=ones)
        s, f = walk(*argsb, c, plus_one=True, ones=ob)
        assert_on_device_of(s, argsb[0])
        assert_equal(s, ref_s)
        assert isinstance(f, np.ndarray) and np.array_equal(f, ref_f)
    ref = walk_diagnostic(K, W, nk2, nw2, ref_s, c, 60, plus_one=True, ones=ones)
    got = walk_diagnostic(*argsb[:4], s, c, 60, plus_one=True, ones=ob)
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-8)


def test_scratch_pool_reuses_memory_best_fit():
    """ScratchPool hands back touched memory (best fit, the rest of a larger array split off) and None where the
    backend's operations take no out= (the walks then allocate as before)."""
    from kvbounds.algorithms.block_walk import ScratchPool
    pool, like = ScratchPool(), np.zeros(1, dtype=np.float32)
    a, b = pool.take(like, 100), pool.take(like, 10)
    assert a.shape == (100,) and a.dtype == np.float32 and b.shape == (10,)
    pool.give(a, b, None)
    c = pool.take(like, 8)                                        # best fit: from b's memory
    assert np.shares_memory(c, b) and not np.shares_memory(c, a)
    d = pool.take(like, 60)                                       # from a; a's last 40 stay free
    assert np.shares_memory(d, a)
    e = pool.take(like, 40)
    assert np.shares_memory(e, a) and not np.shares_memory(e, d)
    assert not np.shares_memory(pool.take(like, 40), a)           # nothing left: fresh memory
    assert not np.shares_memory(pool.take(np.zeros(1), 8), b)     # another dtype: fresh memory
    assert ScratchPool().take([1.0], 3) is None


def test_scratch_pool_keeps_no_device_memory():
    """Off the host (CUDA) the pool hands out nothing and keeps nothing handed back (a GPU's caching allocator
    reuses memory already; a kept array would only raise the peak)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from kvbounds.algorithms.block_walk import ScratchPool
    pool, x = ScratchPool(), torch.zeros(4, device="cuda")
    assert pool.take(x, 4) is None
    pool.give(x)
    assert pool.free == []


def test_host_scratch_is_numpy_memory_aligned_like_torch():
    """Fresh host scratch comes from numpy's allocator (huge pages for large arrays), 64-byte aligned; for torch it
    is a CPU tensor of the asked dtype sharing that memory (zero copy)."""
    torch = pytest.importorskip("torch")
    from kvbounds.algorithms.block_walk import host_empty
    for dt in (torch.float32, torch.float64):
        t = host_empty(torch.zeros(1, dtype=dt), 1000)
        assert t.dtype == dt and t.shape == (1000,) and t.device.type == "cpu" and t.data_ptr() % 64 == 0
        t[:] = 1.0                                                     # writable
    a = host_empty(np.zeros(1, dtype=np.float32), 7)
    assert a.dtype == np.float32 and a.shape == (7,)


def test_fused_gram_panel_equals_unfused():
    """The fused chunk-by-chunk panel (gram_panel with out=, the walk's host path) equals the panel computed in
    whole-panel passes (out=None) bit for bit, with and without padded rows, chunks of 1 block and of several."""
    torch = pytest.importorskip("torch")
    from kvbounds.algorithms import block_walk as bw
    for pad, chunk in ((0, 1), (5, 3), (0, 1 << 12)):
        K, W, nk2, nw2, _, ones = _blocks(2, lead=(2, 3), b=32, d=8, e=4, pad=pad)
        for xs in ((K, W, nk2, nw2), tuple(torch.as_tensor(x, dtype=torch.float32) for x in (K, W, nk2, nw2))):
            Kt, Wt, k2, w2 = xs
            o = None if ones is None else (ones if isinstance(Kt, np.ndarray) else torch.as_tensor(ones, dtype=Kt.dtype))
            xp = bw.array_namespace(Kt)
            rk2, inv = bw.panel_scales(xp, k2, w2)
            for start, m in ((0, 8), (8, 8), (24, 8)):
                args = (Kt[..., start:, :], Wt[..., start:, :], m, rk2, inv, True, None if o is None else o[..., start:])
                ref = bw.gram_panel(*args)
                buf = (bw.host_empty(Kt, 6 * m * 32), bw.host_empty(Kt, max(chunk, m * (32 - start))))
                got = bw.gram_panel(*args, out=buf)
                assert np.array_equal(np.asarray(got), np.asarray(ref))
                whole = bw._gram_panel_whole(bw.array_namespace(Kt), *args, *buf)   # torch's path at >1 thread
                assert np.array_equal(np.asarray(whole), np.asarray(ref))


def test_prescaled_keys_equal_plain_product():
    """blockwise_balance_kv._scaled (keys times d^(-1/4) into scratch memory) equals X * a bit for bit; integer
    arrays and tensors that need gradients fall back to X * a."""
    torch = pytest.importorskip("torch")
    from kvbounds.algorithms.blockwise_balance_kv import ScratchPool, _scaled
    rng = np.random.default_rng(0)
    a = 128 ** -0.25
    for X in (rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3)).astype(np.float32),
              torch.as_tensor(rng.standard_normal((2, 5, 3)), dtype=torch.float32), np.arange(6).reshape(2, 3)):
        got = _scaled(X, a, ScratchPool())
        assert got.dtype == (X * a).dtype and np.array_equal(np.asarray(got), np.asarray(X * a))
    X = torch.ones(3, requires_grad=True)
    assert _scaled(X, a, ScratchPool()).requires_grad
