"""Reference implementations of the algorithms of the seeds, one module per algorithm.

Every function takes arrays of any array-API backend (numpy, torch, cupy) and returns arrays of the
same backend; numpy is the reference the others are tested against.
"""
if __name__ != "kvbounds.algorithms":   # the subpackage kvbounds.algorithms (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.algorithms, not {__name__}: the folder algorithms/ is a subpackage of kvbounds")
