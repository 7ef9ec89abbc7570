"""Reference implementations of the algorithms of the seeds, one module per algorithm.

Every function takes arrays of any array-API backend (numpy, torch, cupy) and returns arrays of the
same backend; numpy is the reference the others are tested against.
"""
if __name__ != "kvbounds.algorithms":   # the subpackage kvbounds.algorithms (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.algorithms, not {__name__}: the folder algorithms/ is a subpackage of kvbounds")

# the room's public modules (each declares its own __all__)
__all__ = ["arrays", "attention", "balance_kv", "balance_kv_released", "balance_layers", "block_walk",
           "blockwise_balance_kv", "blockwise_softmax", "cache_compressors", "compressed_kv", "compressor_adapters",
           "equal_memory", "frequent_directions", "host_scratch", "host_values", "index_reduction", "kcenter",
           "kernel_thinning", "merge_and_reduce", "query_discrepancy", "self_balancing_walk", "softmax_balance",
           "subgen", "subgen_device", "subgen_query", "subgen_rounds", "subspace_attention", "subspace_decode",
           "token_selection", "uniform_sampling", "validation", "walk_diagnostics"]
