"""The SUB.cost decode kernels (kvbounds.algorithms.subspace_decode) on every backend against numpy: same outputs
within the dtype's tolerance, the same operation counts, outputs on the input's device, no host copies."""
import numpy as np
import pytest

from backend_helpers import assert_close, assert_on_device_of, no_torch_host_copy
from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.subspace_decode import OpCounter, coefficient_decode, exact_decode
from kvbounds.algorithms.arrays import array_namespace, asarray


def _decode_inputs(seed=0, J=3, r=4, r_v=5, d=16, L=32):
    rng = np.random.default_rng(seed)
    return dict(q=rng.standard_normal(d), B=rng.standard_normal((J, r, d)), E=rng.standard_normal((J, r_v, d)),
                C=rng.standard_normal((J, r, L)) * 2, D=rng.standard_normal((J, r_v, L)),
                K=rng.standard_normal((J * L, d)), V=rng.standard_normal((J * L, d)))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_coefficient_and_exact_decode_agree_with_numpy(backend, dtype):
    x = _decode_inputs()
    xb = {k: asarray(v, backend, dtype) for k, v in x.items()}
    xn = {k: v.astype(dtype) for k, v in x.items()}
    ref_ops, ops = OpCounter(np), OpCounter(array_namespace(xb["q"]))
    ref = coefficient_decode(*(xn[k] for k in "qBECD"), gamma=0.7, ops=ref_ops)
    out = coefficient_decode(*(xb[k] for k in "qBECD"), gamma=0.7, ops=ops)
    assert_on_device_of(out, xb["q"])
    assert out.dtype == xb["q"].dtype
    assert_close(out, ref, dtype)
    assert (ops.flops, ops.bytes) == (ref_ops.flops, ref_ops.bytes)
    assert_close(coefficient_decode(*(xb[k] for k in "qBECD"), gamma=0.7), ref, dtype)   # uncounted path
    ref_e, ops_e = OpCounter(np), OpCounter(array_namespace(xb["q"]))
    out = exact_decode(xb["q"], xb["K"], xb["V"], ops=ops_e)
    assert_on_device_of(out, xb["q"])
    assert_close(out, exact_decode(xn["q"], xn["K"], xn["V"], ops=ref_e), dtype)
    assert_close(out, exact_attention(x["q"], x["K"], x["V"]), dtype, atol=1e-6)
    assert (ops_e.flops, ops_e.bytes) == (ref_e.flops, ref_e.bytes)


def test_decode_kernels_stay_on_the_device(monkeypatch):
    """The kernels a GPU timing runs make no device-to-host copy (a scalar max is read by float(), not numpy)."""
    torch = pytest.importorskip("torch")
    x = _decode_inputs(1)
    t = {k: torch.as_tensor(v) for k, v in x.items()}
    with no_torch_host_copy(monkeypatch):
        o = coefficient_decode(*(t[k] for k in "qBECD"), gamma=1.0, ops=OpCounter(torch))
        e = exact_decode(t["q"], t["K"], t["V"], ops=OpCounter(torch))
    np.testing.assert_allclose(o.numpy(), coefficient_decode(*(x[k] for k in "qBECD"), gamma=1.0), rtol=1e-10)
    np.testing.assert_allclose(e.numpy(), exact_attention(x["q"], x["K"], x["V"]), rtol=1e-10)


def test_a_numpy_counter_counts_torch_work_without_host_copies(monkeypatch):
    """SUB.cost makes its counters with OpCounter(np) whatever the backend: the kernels run the counted operations in
    the arrays' namespace (np.matmul on torch tensors converted them to numpy: impossible for CUDA tensors)."""
    torch = pytest.importorskip("torch")
    x = _decode_inputs(2)
    t = {k: torch.as_tensor(v) for k, v in x.items()}
    ref_o, ref_e = OpCounter(np), OpCounter(np)
    coefficient_decode(*(x[k] for k in "qBECD"), gamma=1.0, ops=ref_o)
    exact_decode(x["q"], x["K"], x["V"], ops=ref_e)
    ops_o, ops_e = OpCounter(np), OpCounter(np)
    with no_torch_host_copy(monkeypatch):
        o = coefficient_decode(*(t[k] for k in "qBECD"), gamma=1.0, ops=ops_o)
        e = exact_decode(t["q"], t["K"], t["V"], ops=ops_e)
    assert isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor)
    assert (ops_o.flops, ops_o.bytes, ops_e.flops, ops_e.bytes) == (ref_o.flops, ref_o.bytes, ref_e.flops, ref_e.bytes)


@pytest.mark.parametrize("name", ["q", "B", "E", "C", "D"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_numpy_decode_names_a_non_finite_input_without_warnings(name, bad):
    """The numpy path does not scan q, B, E before computing (speed); a NaN/Inf in them still raises the entry
    check's InputError naming the array (and one in the cache C, D the output's), with no RuntimeWarning."""
    import warnings
    from kvbounds.algorithms.validation import InputError
    x = {k: v.astype(np.float32) for k, v in _decode_inputs(3).items()}
    x[name][(0,) * x[name].ndim] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=f"^{name} contains NaN or Inf" if name in "qBE" else "cache C or D"):
            coefficient_decode(*(x[k] for k in "qBECD"), gamma=1.0)
