"""The batched walk (kvbounds.gpu.batched_walk) gives the package's reference signs given the same uniforms."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvbounds.algorithms.blockwise_balance_kv import blockwise_balance_select, panel_walk
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import like, to_numpy
from kvbounds.gpu.batched_walk import batched_select, ops_per_step, walk_signs

EAGER = ["exact", "blocked"]


def _inputs(rng, lead, b, d, e, dtype, backend):
    K = rng.standard_normal(lead + (b, d)) * rng.uniform(0.2, 1.5)
    W = rng.standard_normal(lead + (b, e))
    u = rng.random(lead + (b,))
    if backend == "torch:cpu":
        import torch
        K, W, u = (torch.as_tensor(x, dtype=getattr(torch, dtype)) for x in (K, W, u))
    else:
        K, W, u = (x.astype(dtype) for x in (K, W, u))
    return K, W, (K * K).sum(-1), (W * W).sum(-1) + 1.0, u


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
@pytest.mark.parametrize("method", EAGER)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), lead=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       b=st.sampled_from([2, 6, 32, 64, 96]), d=st.integers(1, 6), e=st.integers(1, 4),
       c=st.floats(0.5, 30.0), dtype=st.sampled_from(["float64", "float32"]))
def test_walk_signs_equal_reference(backend, method, seed, lead, b, d, e, c, dtype):
    if backend == "torch:cpu":
        pytest.importorskip("torch")
    if method == "blocked" and dtype == "float32":
        dtype = "float64"      # blocked sums in another order: equal signs are claimed in float64 only
    K, W, nk2, nw2, u = _inputs(np.random.default_rng(seed), tuple(lead), b, d, e, dtype, backend)
    ref, ref_fail = panel_walk(K, W, nk2, nw2, u, c, plus_one=True)
    signs, x = walk_signs(K, W, nk2, nw2, u, c, plus_one=True, method=method)
    assert np.array_equal(to_numpy(signs), to_numpy(ref))
    assert np.array_equal(to_numpy(abs(x) > c).any(axis=-1), ref_fail)


@pytest.mark.parametrize("method", EAGER)
def test_walk_signs_with_padding_rows(method, rng):
    K, W, nk2, nw2, u = _inputs(rng, (2, 3), 64, 4, 3, "float64", "numpy")
    ones = np.ones((3, 64))
    ones[-1, 40:] = 0.0
    K[:, -1, 40:] = 0.0
    W[:, -1, 40:] = 0.0
    nk2, nw2 = (K * K).sum(-1), (W * W).sum(-1) + ones
    ref, _ = panel_walk(K, W, nk2, nw2, u, 7.0, plus_one=True, ones=ones)
    signs, _ = walk_signs(K, W, nk2, nw2, u, 7.0, plus_one=True, ones=ones, method=method)
    assert np.array_equal(signs, ref)


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
@pytest.mark.parametrize("method", EAGER)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31), trials=st.integers(1, 3), heads=st.integers(1, 2),
       n=st.integers(8, 300), b=st.sampled_from([4, 32, 64]), levels=st.integers(0, 3),
       kernel=st.sampled_from(["value", "value+1"]))
def test_batched_select_equals_reference_per_trial(backend, method, seed, trials, heads, n, b, levels, kernel):
    levels = min(levels, int(np.log2(n)))
    g = np.random.default_rng(seed)
    K, V = g.standard_normal((trials, heads, n, 8)), g.standard_normal((trials, heads, n, 3))
    if backend == "torch:cpu":
        import torch
        K, V = torch.as_tensor(K), torch.as_tensor(V)
    seeds = [seed + t for t in range(trials)]
    out = to_numpy(batched_select(K, V, block_size=b, levels=levels, value_kernel=kernel, method=method,
                                  rngs=[np.random.default_rng(s) for s in seeds]))
    for t, s in enumerate(seeds):
        ref = blockwise_balance_select(K[t], V[t], block_size=b, levels=levels, value_kernel=kernel,
                                       rng=np.random.default_rng(s))
        assert np.array_equal(out[t], to_numpy(ref))


def test_float32_torch_exact_is_bit_identical(rng):
    torch = pytest.importorskip("torch")
    K, W, nk2, nw2, u = _inputs(rng, (4, 16), 256, 16, 17, "float32", "torch:cpu")
    ref, _ = panel_walk(K, W, nk2, nw2, u, 30 * np.log(256 / 0.01), plus_one=True)
    signs, _ = walk_signs(K, W, nk2, nw2, u, 30 * np.log(256 / 0.01), plus_one=True, method="exact")
    assert torch.equal(signs, ref)


def test_bad_input_raises(rng):
    K, W, nk2, nw2, u = _inputs(rng, (2,), 8, 2, 2, "float64", "numpy")
    with pytest.raises(InputError, match="method"):
        walk_signs(K, W, nk2, nw2, u, 1.0, method="fast")
    with pytest.raises(InputError, match="uniforms"):
        walk_signs(K, W, nk2, nw2, u[..., :4], 1.0)
    with pytest.raises(InputError, match="rngs"):
        batched_select(K[None], W[None], block_size=4, levels=1, rngs=[])
    with pytest.raises(InputError, match="block_size"):
        batched_select(K[None], W[None], block_size=3, levels=1, rngs=[rng])


def test_ops_per_step_exact_is_about_five():
    pytest.importorskip("torch")
    r = ops_per_step("exact", sizes=(32, 64), blocks=2, d=4)
    assert 4.5 <= r["per_step"] <= 6.5, r


@pytest.mark.slow
def test_compiled_equals_reference_and_cuts_ops():
    torch = pytest.importorskip("torch")
    from kvbounds.gpu.batched_walk import compiled_available
    if not compiled_available():
        pytest.skip("torch.compile unavailable here")
    g = np.random.default_rng(3)
    K, W, nk2, nw2, u = _inputs(g, (3, 5), 128, 8, 5, "float64", "torch:cpu")
    ref, _ = panel_walk(K, W, nk2, nw2, u, 12.0, plus_one=True)
    signs, _ = walk_signs(K, W, nk2, nw2, u, 12.0, plus_one=True, method="compiled")
    assert torch.equal(signs, ref)
    assert ops_per_step("compiled")["per_step"] < 1.5


_TRITON_SCRIPT = """
import numpy as np, torch
from kvbounds.algorithms.blockwise_balance_kv import panel_walk
from kvbounds.gpu.batched_walk import walk_signs
g = np.random.default_rng(0)
for dt in (torch.float64, torch.float32):
    for b in (6, 64, 96):
        K, W, u = (torch.as_tensor(x, dtype=dt) for x in (g.standard_normal((2, 3, b, 8)) * 0.5,
                                                          g.standard_normal((2, 3, b, 5)), g.random((2, 3, b))))
        nk2, nw2 = (K * K).sum(-1), (W * W).sum(-1) + 1.0
        ref, _ = panel_walk(K, W, nk2, nw2, u, 5.0, plus_one=True)
        signs, x = walk_signs(K, W, nk2, nw2, u, 5.0, plus_one=True, method="triton")
        _, x_exact = walk_signs(K, W, nk2, nw2, u, 5.0, plus_one=True, method="exact")
        assert torch.equal(signs, ref) and torch.equal(x, x_exact), (dt, b)
print("ok")
"""


def test_triton_kernel_in_interpreter_is_bit_identical():
    """The Triton panel kernel run by Triton's CPU interpreter (a subprocess: TRITON_INTERPRET is read at
    import): same x, hence the same signs, as the exact path and the reference, float64 and float32."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def test_triton_method_falls_back_without_triton(rng):
    K, W, nk2, nw2, u = _inputs(rng, (2,), 32, 4, 3, "float64", "numpy")
    ref, _ = panel_walk(K, W, nk2, nw2, u, 5.0, plus_one=True)
    assert np.array_equal(walk_signs(K, W, nk2, nw2, u, 5.0, plus_one=True, method="triton")[0], ref)


@pytest.mark.parametrize("method", EAGER + ["triton"])
def test_batched_select_and_walk_agree_with_numpy(backend, method):
    """The batched walk on the backend fixture (CUDA/CuPy where present) against the numpy reference: the same
    signs and kept indices from the same seeds, x within the dtype's tolerance, results on the input's device.
    ``triton`` runs the kernel on CUDA and falls back to ``exact`` elsewhere."""
    from backend_helpers import assert_close, assert_equal, assert_on_device_of
    from kvbounds.algorithms.arrays import asarray
    g = np.random.default_rng(21)
    K, V = g.standard_normal((2, 2, 150, 8)), g.standard_normal((2, 2, 150, 3))
    Kb, Vb = asarray(K, backend), asarray(V, backend)
    out = batched_select(Kb, Vb, block_size=32, levels=2, method=method,
                         rngs=[np.random.default_rng(s) for s in (4, 5)])
    assert_on_device_of(out, Kb)
    for t, s in enumerate((4, 5)):
        assert_equal(out[t], blockwise_balance_select(K[t], V[t], block_size=32, levels=2, rng=np.random.default_rng(s)))
    Kw, W, nk2, nw2, u = _inputs(g, (2, 3), 64, 5, 4, "float64", "numpy")
    ref_s, ref_x = walk_signs(Kw, W, nk2, nw2, u, 6.0, plus_one=True, method="exact")
    s, x = walk_signs(*(asarray(a, backend) for a in (Kw, W, nk2, nw2, u)), 6.0, plus_one=True, method=method)
    assert_on_device_of(s, asarray(u, backend))
    assert_equal(s, ref_s)
    assert_close(x, ref_x, atol=1e-9)


def test_compiled_probe_asks_about_the_tensors_device(monkeypatch):
    """method="compiled" asks whether torch.compile works on the *tensors'* device type (a CPU probe said
    nothing about CUDA, where inductor needs Triton), and falls back to "blocked" when it does not."""
    torch = pytest.importorskip("torch")
    from kvbounds.gpu import batched_walk
    asked = []
    monkeypatch.setattr(batched_walk, "compiled_available", lambda device_type="cpu": asked.append(device_type))
    K, W, nk2, nw2, u = _inputs(np.random.default_rng(2), (2,), 64, 4, 3, "float64", "torch:cpu")
    signs, _ = walk_signs(K, W, nk2, nw2, u, 6.0, plus_one=True, method="compiled")
    assert asked == [K.device.type]
    assert torch.equal(signs, walk_signs(K, W, nk2, nw2, u, 6.0, plus_one=True, method="blocked")[0])
