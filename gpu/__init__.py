"""GPU code: the batched BalanceKV walk over many streams (:mod:`kvbounds.gpu.batched_walk`), its Triton kernel
(:mod:`kvbounds.gpu.triton_walk`) and which checks run on a GPU backend (:mod:`kvbounds.gpu.support`). The array
layer every module uses (backend names, namespaces, devices) is :mod:`kvbounds.algorithms.arrays`."""
if __name__ != "kvbounds.gpu":   # the subpackage kvbounds.gpu (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.gpu, not {__name__}: the folder gpu/ is a subpackage of kvbounds")

# the room's public modules (each declares its own __all__)
__all__ = ["batched_walk", "support", "triton_walk"]
