"""Array backends: numpy (reference), torch (CPU and CUDA), cupy. See :mod:`kvbounds.gpu.backend`."""
from .backend import available_backends, array_namespace, asarray, to_numpy, validate_backend, backend_of

__all__ = ["available_backends", "array_namespace", "asarray", "to_numpy", "validate_backend", "backend_of"]
