"""One check module per claim id. Each exposes CLAIM, trials(profile), run_trial(params, seed, backend)
and summarize(records); see :mod:`kvbounds.claims` for the protocol and :mod:`kvbounds.proofs_checks.common`."""
if __name__ != "kvbounds.proofs_checks":   # the subpackage kvbounds.proofs_checks (pyproject.toml's package-dir)
    raise ImportError(f"import kvbounds.proofs_checks, not {__name__}: the folder proofs_checks/ is a subpackage of kvbounds")

# the room's public modules (each declares its own __all__)
__all__ = ["bkv_ablation", "bkv_attention", "bkv_decode", "bkv_e2e", "bkv_memory", "bkv_trivial", "bkv_variants",
           "bkv_vs_uniform", "bkv_walk_share", "common", "decode_stream", "decode_verdict", "fd_covariance",
           "fd_residual", "lb_index", "lb_index_games", "lb_index_proof_steps", "lb_index_verdict", "mr_error",
           "mr_memory", "norm_bounded", "sb_cost", "sb_discrepancy", "sbw_balance", "sbw_kernel_identity",
           "sg_attention", "sg_clusterability", "sg_clusters", "sg_decode", "sg_e2e", "sg_matprod", "sg_partition",
           "sg_reservoir", "sub_blockwise", "sub_cost", "sub_logit_error", "sub_logit_power", "sub_lowrank",
           "sub_lowrank_e2e", "sub_output_error", "sub_softmax_sensitivity", "walk_cause"]
