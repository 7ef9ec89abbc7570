"""Array backends: numpy (reference), torch (CPU and CUDA), cupy. See :mod:`kvbounds.gpu.backend`."""
if __name__ != "kvbounds.gpu":   # this folder is the subpackage kvbounds.gpu (kvbounds/gpu links here)
    raise ImportError(f"import kvbounds.gpu, not {__name__}: the folder gpu/ is a subpackage of kvbounds")
from .backend import available_backends, array_namespace, asarray, to_numpy, validate_backend, backend_of

__all__ = ["available_backends", "array_namespace", "asarray", "to_numpy", "validate_backend", "backend_of"]
