"""Count host round-trips of torch tensors during a call (issue 15: keep a GPU busy).

On CUDA each of these waits for the device: a read of a value on the host (``item``, ``bool``/``float``/``int``/
``__index__``, ``tolist``, ``numpy``, ``__array__``, and any ``aten._local_scalar_dense`` torch issues internally, e.g.
indexing with a 0-d tensor), a boolean-mask index (its size is data-dependent: ``nonzero``), and a copy of host data
to the device (``torch.as_tensor``/``tensor``/``asarray``/``from_numpy`` of non-tensor data, a numpy array used as an
index or assigned into a tensor). On torch:cpu nothing waits, but the same calls happen, so counting them on CPU tells
what a CUDA run would pay::

    with count_syncs() as c:
        sg.update_many(K, V)
    assert c.total <= 0.1 * K.shape[0]

``c.reads``, ``c.uploads`` and ``c.masks`` split the total; ``c.where`` counts each site (``name`` of the call).
"""
from __future__ import annotations

import collections
import contextlib

import numpy as np

READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "__array__")
UPLOADS = ("as_tensor", "tensor", "asarray", "from_numpy")


class SyncCounter:
    def __init__(self):
        self.reads = self.uploads = self.masks = 0
        self.where: collections.Counter = collections.Counter()
        self._depth = 0          # inside a patched call: torch's own inner scalar reads are not counted twice

    @property
    def total(self) -> int:
        return self.reads + self.uploads + self.masks

    def _add(self, kind: str, name: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.where[name] += 1

    def __repr__(self) -> str:
        return f"SyncCounter(reads={self.reads}, uploads={self.uploads}, masks={self.masks}, where={dict(self.where)})"


def _host_data(x) -> bool:
    import torch
    return not isinstance(x, torch.Tensor)


def _has_numpy(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, np.ndarray) for i in items)


@contextlib.contextmanager
def count_syncs():
    """Patch torch (restored on exit) and yield a :class:`SyncCounter`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    c = SyncCounter()
    saved = {}

    def wrap(owner, name, kind, test=None):
        orig = getattr(owner, name)
        saved[(owner, name)] = orig

        def patched(*a, **k):
            if test is None or test(*a, **k):
                if c._depth == 0:
                    c._add(kind, name)
            c._depth += 1
            try:
                return orig(*a, **k)
            finally:
                c._depth -= 1
        setattr(owner, name, patched)

    for name in READS:
        wrap(torch.Tensor, name, "reads")
    for name in UPLOADS:
        wrap(torch, name, "uploads", lambda data, *a, **k: _host_data(data))
    wrap(torch.Tensor, "__getitem__", "uploads", lambda self, index: _has_numpy(index))
    wrap(torch.Tensor, "__setitem__",  "uploads",
         lambda self, index, value: _has_numpy(index) or isinstance(value, np.ndarray))

    class Internal(TorchDispatchMode):
        """Scalar reads and data-dependent shapes torch performs below the Python methods patched above."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if c._depth == 0:
                name = func.overloadpacket.__name__
                if name == "_local_scalar_dense":
                    c._add("reads", "internal item")
                elif name in ("nonzero", "masked_select", "unique", "_unique2"):
                    c._add("masks", name)
                elif name in ("index", "index_put", "index_put_") and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool
                        for i in (args[1] if len(args) > 1 else ()) if i is not None):
                    c._add("masks", f"{name} (boolean mask)")
            return func(*args, **kwargs)

    try:
        with Internal():
            yield c
    finally:
        for (owner, name), orig in saved.items():
            setattr(owner, name, orig)
