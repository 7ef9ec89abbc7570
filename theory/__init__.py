"""Bounds of each claim as functions of their parameters; symbolic lemmas; cost models."""
if __name__ != "kvbounds.theory":   # the subpackage kvbounds.theory (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.theory, not {__name__}: the folder theory/ is a subpackage of kvbounds")

# the room's public modules (each declares its own __all__)
__all__ = ["balancekv", "empirical", "frequent_directions", "kernel_identity", "lower_bound", "sbw_exact", "subgen",
           "subspace"]
