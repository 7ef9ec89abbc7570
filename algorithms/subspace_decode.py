"""One decode step of coefficient-space attention and of exact attention, batched over chunks, with counted
floating-point operations and bytes (claim SUB.cost; the subspace/FD draft's roofline section). The attention
classes live in :mod:`kvbounds.algorithms.subspace_attention`, which re-exports these kernels.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace

from .validation import InputError, check_array, check_real, namespace

__all__ = ["OpCounter", "coefficient_decode", "exact_decode"]


class OpCounter:
    """Runs array operations and tallies floating-point operations (a multiply-add is 2) and bytes read
    from the cache (``load``) or written (``store``). The kernels below run it in their arrays' own namespace
    (:meth:`using`), so a counter made with ``OpCounter(np)`` also counts torch/CuPy work, on the device."""

    def __init__(self, xp, count: bool = True):
        self.xp, self.count = xp, count
        self.flops = 0
        self.bytes = 0

    def using(self, xp) -> "OpCounter":
        """This counter, running its operations in ``xp`` (the namespace of the arrays it is given)."""
        self.xp = xp
        return self

    def _n(self, x) -> int:
        return int(math.prod(x.shape))

    def load(self, x):
        if self.count:
            self.bytes += self._n(x) * x.dtype.itemsize if hasattr(x.dtype, "itemsize") else 0
        return x

    def store(self, x):
        return self.load(x)

    def matmul(self, a, b):
        out = self.xp.matmul(a, b)
        if self.count:
            k = a.shape[-1]
            self.flops += 2 * k * self._n(out)
        return out

    def elementwise(self, fn, *xs):
        out = fn(*xs)
        if self.count:
            self.flops += self._n(out)
        return out

    def reduce(self, fn, x, **kw):
        if self.count:
            self.flops += self._n(x)
        return fn(x, **kw)


def _check_max(m) -> None:
    if not math.isfinite(float(m)):
        raise InputError("the largest logit overflows the float range (this timing kernel does not rescale; "
                         "kvbounds.algorithms.attention.exact_attention does)")


def coefficient_decode(q, B, E, C, D, *, gamma: float, ops: OpCounter | None = None):
    """One decode step over J equal-length chunks: q (d,), B (J, r, d), E (J, r_v, d), and the coefficients in
    coefficient-major layout C (J, r, L), D (J, r_v, L) (row c of C_j^T holds coefficient c of every token of chunk
    j, contiguous: the layout a fused kernel streams). Equals the one-pass blockwise softmax of Sec. 6 (here every
    chunk's max is known before the weights are formed, so the rescaling factors are 1)."""
    if ops is None and _plain_numpy_call(q, B, E, C, D, gamma):
        # numpy, uncounted, shapes/dtypes/gamma valid: the finiteness of q, B, E is not scanned up front (3 passes,
        # ~15 us at the benchmark's size): a NaN/Inf in them reaches the output, and then the entry checks below
        # run and raise the same InputError as they would have before computing anything
        with np.errstate(all="ignore"):
            o = _coefficient_decode_numpy(q, B, E, C, D, float(gamma))
            if math.isfinite(float(np.add.reduce(o, axis=None))):    # one pass over d floats, not three checks
                return o
        _check_decode_inputs(q, B, E, C, D, gamma)
        return _finite_output(o)
    gamma = _check_decode_inputs(q, B, E, C, D, gamma)
    if ops is None and all(type(x) is np.ndarray for x in (q, B, E, C, D)):
        return _finite_output(_coefficient_decode_numpy(q, B, E, C, D, gamma))
    xp = array_namespace(q, C)
    ops = OpCounter(xp, count=False) if ops is None else ops.using(xp)   # np.matmul on CUDA tensors would fail
    d = q.shape[0]
    J, r = B.shape[0], B.shape[1]
    qt = xp.reshape(ops.matmul(xp.reshape(ops.load(B), (J * r, d)), ops.load(q)), (J, r))   # one GEMV: 2 J r d
    qt = ops.elementwise(lambda x: x * (gamma / math.sqrt(d)), qt)               # J r
    logits = ops.matmul(qt[:, None, :], ops.load(C))                             # (J, 1, L)     2 T r
    m = ops.reduce(xp.max, logits)                                               # T
    _check_max(m)
    w = ops.elementwise(xp.exp, ops.elementwise(lambda a: a - m, logits))        # 2 T
    Z = ops.reduce(xp.sum, w)                                                    # T
    n = ops.matmul(ops.load(D), xp.matrix_transpose(w))[..., 0]                  # (J, r_v)      2 T r_v
    o = ops.matmul(xp.reshape(n, (1, -1)), xp.reshape(ops.load(E), (-1, E.shape[-1])))[0]   # 2 J r_v d
    return _finite_output(ops.store(ops.elementwise(lambda a: a / Z, o)))        # d


def _check_decode_inputs(q, B, E, C, D, gamma) -> float:
    """coefficient_decode's entry checks (InputError naming the problem); returns gamma as a float."""
    check_array(q, "q", ndim=1)
    check_array(B, "B", ndim=3, last_dim=q.shape[0], min_rows=1)
    check_array(E, "E", ndim=3, min_rows=1)
    # the cache C, D (O(T) floats) is checked for shape only, not scanned each step: a NaN/Inf in it reaches the
    # output, which is checked below
    check_array(C, "C", ndim=3, min_rows=1, finite=False)
    check_array(D, "D", ndim=3, min_rows=1, finite=False)
    J, r, L = B.shape[0], B.shape[1], C.shape[2]
    if J == 0 or L == 0 or tuple(C.shape) != (J, r, L) or D.shape[0] != J or D.shape[2] != L or E.shape[:2] != D.shape[:2]:
        raise InputError(f"need B (J, r, d), E (J, r_v, d'), C (J, r, L), D (J, r_v, L) with J, L >= 1; got B "
                         f"{tuple(B.shape)}, E {tuple(E.shape)}, C {tuple(C.shape)}, D {tuple(D.shape)}")
    namespace(q, B, E, C, D, names="q, B, E, C and D")
    return check_real(gamma, "gamma")


_FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.longdouble))


def _plain_numpy_call(q, B, E, C, D, gamma) -> bool:
    """True when :func:`_check_decode_inputs` can fail only on a NaN/Inf in q, B or E: five numpy arrays of real
    floating dtypes (float32 or wider), consistent non-empty shapes, gamma a finite Python float or int."""
    np_ = np.ndarray
    if not (type(q) is np_ and type(B) is np_ and type(E) is np_ and type(C) is np_ and type(D) is np_):
        return False
    if not (q.dtype in _FLOATS and B.dtype in _FLOATS and E.dtype in _FLOATS and C.dtype in _FLOATS
            and D.dtype in _FLOATS):
        return False
    if type(gamma) not in (float, int) or not math.isfinite(gamma):
        return False
    if q.ndim != 1 or B.ndim != 3 or E.ndim != 3 or C.ndim != 3 or D.ndim != 3:
        return False
    J, r, d = B.shape
    L = C.shape[2]
    return (min(J, r, d, L, E.shape[1], E.shape[2]) > 0 and q.shape[0] == d and C.shape == (J, r, L)
            and D.shape[0] == J and D.shape[2] == L and E.shape[:2] == D.shape[:2])


def _finite_output(o):
    """The decode's output; NaN/Inf in it can only come from the unscanned cache C, D (see coefficient_decode)."""
    if not bool(array_namespace(o).all(array_namespace(o).isfinite(o))):
        raise InputError("coefficient_decode: the output is not finite: the cache C or D contains NaN or Inf "
                         "(or its logits overflow)")
    return o


def _coefficient_decode_numpy(q, B, E, C, D, gamma: float):
    """coefficient_decode for numpy arrays without operation counting: the same operations, the O(T) ones in
    place (no temporaries of T floats); the reference is the counted path (tests compare them)."""
    d = q.shape[0]
    J, r = B.shape[0], B.shape[1]
    qt = (B.reshape(J * r, d) @ q).reshape(J, 1, r)
    qt *= gamma / math.sqrt(d)
    w = np.matmul(qt, C)                                                         # (J, 1, L)
    w -= w.max()
    np.exp(w, out=w)
    n = np.matmul(D, w.transpose(0, 2, 1))                                       # (J, r_v, 1)
    o = n.reshape(1, -1) @ E.reshape(-1, E.shape[-1])
    o = o[0]
    o /= w.sum()
    return o


def exact_decode(q, K, V, *, ops: OpCounter | None = None):
    """One decode step of exact attention softmax(K q / sqrt d)^T V with the same operation accounting."""
    check_array(q, "q", ndim=1)
    check_array(K, "K", ndim=2, last_dim=q.shape[0], min_rows=1)
    check_array(V, "V", ndim=2)
    if V.shape[0] != K.shape[0]:
        raise InputError(f"K and V must have the same number of rows, got {K.shape[0]} and {V.shape[0]}")
    namespace(q, K, V, names="q, K and V")
    xp = array_namespace(q, K)
    ops = OpCounter(xp, count=False) if ops is None else ops.using(xp)
    d = q.shape[0]
    logits = ops.matmul(ops.load(K), ops.load(q))                                # 2 T d
    logits = ops.elementwise(lambda x: x * (1.0 / math.sqrt(d)), logits)         # T
    m = ops.reduce(xp.max, logits)                                               # T
    _check_max(m)
    w = ops.elementwise(xp.exp, ops.elementwise(lambda a: a - m, logits))        # 2 T
    Z = ops.reduce(xp.sum, w)                                                    # T
    o = ops.matmul(w, ops.load(V))                                               # 2 T d
    return ops.store(ops.elementwise(lambda a: a / Z, o))                        # d
