"""The claim registry: one entry per claim id of ``../shared/CLAIMS.md``.

A claim is data: its statement, its source (seed file and theorem), the dotted path of its bound
function in ``theory/`` and the dotted path of its check module in ``proofs_checks/``. An entry with
an empty ``check`` is listed as "no check yet".

A check module exposes
    ``CLAIM``                          the claim id it checks,
    ``trials(profile) -> list[dict]``  the parameter grid of the profile ("smoke", "quick", "full"),
    ``run_trial(params, seed, backend) -> Record | list[Record]``,
    ``summarize(records) -> Verdict``  the claim-level verdict from all its records.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from types import ModuleType
from typing import Callable

SEEDS = {
    "000": "000_54b4e1352ae92379.txt (BalanceKV, early version)",
    "001": "001_0d3d682c7516b587.txt (BalanceKV, later version)",
    "002": "002_c0f804644c13f6b5.txt (SubGen)",
    "003": "003_d11e1a2aa3a7a37b.txt (ClusterGen)",
    "004": "004_2e7c083f2670118d.txt (subspace projection + Frequent Directions)",
}


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    family: str
    statement: str
    source: str
    bound: str = ""   # "module:function" in theory/
    check: str = ""   # module in proofs_checks/
    kind: str = "theorem"   # theorem | lemma | algorithm property | cost | empirical (the verdict rules differ by kind)

    def bound_function(self) -> Callable | None:
        if not self.bound:
            return None
        mod, _, fn = self.bound.partition(":")
        if importlib.util.find_spec(mod) is None:
            return None
        return getattr(importlib.import_module(mod), fn, None)

    def check_module(self) -> ModuleType | None:
        return importlib.import_module(self.check) if self.has_check else None

    @property
    def has_check(self) -> bool:
        """The check module named by ``check`` exists (entries name their planned module up front)."""
        return bool(self.check) and importlib.util.find_spec(self.check) is not None


_BKV = "BalanceKV"
_SG = "SubGen/ClusterGen"
_FD = "Subspace/FD"

CLAIMS: dict[str, Claim] = {c.id: c for c in [
    Claim("SBW.balance", _BKV,
          "Self-balancing walk with c = 30 log(n/delta): for any fixed u, |sum_{U'}<u_i,u> - sum_{not U'}<u_i,u>| "
          "<= O(log(n/delta) max||u_i|| ||u||) w.p. >= 1-delta; FAIL (|<w,u_i>| > c r^2) w.p. <= delta; "
          "growth in n vs independent random signs (sqrt n).",
          "001 Thm A.1, Alg. 3 (Self-Balancing Walk); 000 Thm thm:BALANCE-ALS21",
          "kvbounds.theory.balancekv:sbw_discrepancy_shape", "kvbounds.proofs_checks.sbw_balance", kind="theorem"),
    Claim("SBW.kernel-identity", _BKV,
          "phi(k) = ((k/d^{1/4})^{(x)i}/sqrt(i!))_i satisfies <phi(k),phi(q)> = exp(<k,q>/sqrt d) and "
          "||phi(k)||^2 = exp(||k||^2/sqrt d); explicit tail bound for truncations.",
          "001 A.2 (proof of Thm 3.3); 000 sec:appendix_softmax_balance",
          "kvbounds.theory.kernel_identity:truncation_tail_bound", "kvbounds.proofs_checks.sbw_kernel_identity", kind="lemma"),
    Claim("SB.discrepancy", _BKV,
          "SoftmaxBalance: |C'| <= |C|/2 and for any q w.p. >= 1-delta, ||sum_{C'} e^{<k,q>/sqrt d} v - sum_{C\\C'} ...|| "
          "<= O(sqrt(s) log(ns/delta) e^{||q||^2/(2 sqrt d)} e^{max||k||^2/(2 sqrt d)} max||v||).",
          "001 Thm 3.3, Alg. 2; 000 thm:BALANCE-vectors",
          "kvbounds.theory.balancekv:softmax_balance_shape", "kvbounds.proofs_checks.sb_discrepancy", kind="theorem"),
    Claim("SB.cost", _BKV,
          "SoftmaxBalance runs in O((d+s) n^2) time and O((d+s) n) memory.",
          "001 Thm 3.3; 000 thm:BALANCE-vectors",
          "kvbounds.theory.balancekv:softmax_balance_cost", "kvbounds.proofs_checks.sb_cost", kind="cost"),
    Claim("MR.error", _BKV,
          "MergeAndReduce with t = O~(sqrt(s) e^{2r^2/sqrt d}/eps) (001) or O*(e^{2r^2/sqrt d}/eps) (000), T = log2(n/t): "
          "at every j, ||sum_{i<=j} e^{<k_i,q_j>/sqrt d} v_i - z_j|| <= eps j e^{-r^2/sqrt d} max||v||.",
          "001 Thm 3.4, Alg. 4; 000 thm:MergeAndReduce",
          "kvbounds.theory.balancekv:merge_reduce_error_bound", "kvbounds.proofs_checks.mr_error", kind="theorem"),
    Claim("MR.memory", _BKV,
          "At most log2(n/t) cells occupied, each |C^i| <= t; total memory O(d t log(n/t)); per-step time "
          "O~(d s e^{4r^2/sqrt d}/eps^2).",
          "001 Thm 3.4, Alg. 4; 000 thm:MergeAndReduce",
          "kvbounds.theory.balancekv:merge_reduce_memory_bound", "kvbounds.proofs_checks.mr_memory", kind="cost"),
    Claim("BKV.attention", _BKV,
          "BalanceKV: at every j, ||z_j - Attn(q_j,K_j,V_j)|| <= eps ||softmax(K_j q_j/sqrt d)|| ||V_j||_F "
          "w.p. >= 1 - 1/poly(n), for ||q||,||k|| <= r.",
          "001 Thm 3.1, Alg. 1; 000 thm:main-theorem, alg:main",
          "kvbounds.theory.balancekv:balance_kv_error_bound", "kvbounds.proofs_checks.bkv_attention", kind="theorem"),
    Claim("BKV.memory", _BKV,
          "Total memory O~(d sqrt(d) e^{2r^2/sqrt d}/eps) (001) / O*(e^{2r^2/sqrt d}/eps) (000); O(log n) live value-norm "
          "buckets; erased small-norm buckets contribute at most their share of the error (Alg. 1 line 8 vs 001 A.1).",
          "001 Thm 3.1, Alg. 1 line 8, A.1; 000 thm:main-theorem",
          "kvbounds.theory.balancekv:balance_kv_memory_shape", "kvbounds.proofs_checks.bkv_memory", kind="cost"),
    Claim("BKV.vs-uniform", _BKV,
          "Empirical: at equal memory, BalanceKV's relative attention error is lower than independent uniform sampling "
          "(first/last tokens kept, middle compressed by 2^-T, T = 1..4).",
          "001 Sec. 4.1, Fig. 1, App. B.1",
          "kvbounds.theory.empirical:relative_error", "kvbounds.proofs_checks.bkv_vs_uniform", kind="empirical"),
    Claim("BKV.ablation", _BKV,
          "Empirical: error falls and runtime rises as batch size grows.", "001 Fig. 3, App. B.1",
          "kvbounds.theory.empirical:relative_error", "kvbounds.proofs_checks.bkv_ablation", kind="empirical"),
    Claim("LB.index", _BKV,
          "Space lower bound Omega(min{1/eps^2, d e^{2r^2/sqrt d}}) for r^2 <= d via INDEX; Lemmas C.3-C.6 and the game.",
          "001 Thm 3.2, App. C",
          "kvbounds.theory.lower_bound:space_lower_bound", "kvbounds.proofs_checks.lb_index", kind="theorem"),
    Claim("NORM.bounded", _BKV,
          "Empirical: q/k/v norms concentrate and do not grow with sequence length.", "001 Table 3; 003 Table 1",
          "kvbounds.theory.empirical:norm_interval", "kvbounds.proofs_checks.norm_bounded", kind="empirical"),
    Claim("SG.reservoir", _SG,
          "After n tokens, M holds s i.i.d. samples with Pr[M(j) = (k_i,v_i)] = ||v_i||^2 / sum ||v_l||^2 "
          "(003 prose says ||k_i||^2).", "002 Lemma 1; 003 Lemma 2.2",
          "kvbounds.theory.subgen:reservoir_probability", "kvbounds.proofs_checks.sg_reservoir", kind="lemma"),
    Claim("SG.clusters", _SG, "Streaming clustering invariants (1)-(5) and m' <= m for (m,delta)-clusterable keys.",
          "002 Lemma 2; 003 Lemma 2.3",
          "kvbounds.theory.subgen:cluster_count_bound", "kvbounds.proofs_checks.sg_clusters", kind="lemma"),
    Claim("SG.partition", _SG, "With t = Omega(eps^-2 e^{2 delta r} log n), tau in (1 +- eps/3) sum_j exp(<k_j,q>) w.p. >= 0.995.",
          "002 Thm 1; 003 Thm 2.4",
          "kvbounds.theory.subgen:partition_bound", "kvbounds.proofs_checks.sg_partition", kind="theorem"),
    Claim("SG.matprod", _SG, "With s = Omega(eps^-2 d), ||z - exp(Kq)^T V|| <= (eps/3) ||exp(Kq)|| ||V||_op w.p. >= 0.995.",
          "002 Thm 1; 003 Thm 2.4",
          "kvbounds.theory.subgen:matprod_bound", "kvbounds.proofs_checks.sg_matprod", kind="theorem"),
    Claim("SG.attention", _SG, "||z/tau - Attn|| <= eps ||softmax(Kq)|| ||V||_op w.p. >= 0.99; memory and time O(d(mt+s)).",
          "002 Thm 1; 003 Thm 2.4",
          "kvbounds.theory.subgen:attention_bound", "kvbounds.proofs_checks.sg_attention", kind="theorem"),
    Claim("SG.clusterability", _SG, "Empirical: keys more clusterable than values; RoPE keys more than absolute-position keys.",
          "003 Table 1, Fig. 1",
          "kvbounds.theory.subgen:kcenter_radius", "kvbounds.proofs_checks.sg_clusterability", kind="empirical"),
    Claim("FD.covariance", _FD, "FD sketch: 0 <= A^T A - S^T S and ||A^T A - S^T S|| <= ||A - A_r||_F^2/(l - r).",
          "004 (Liberty 2013; GLPW 2016)",
          "kvbounds.theory.frequent_directions:covariance_bound", "kvbounds.proofs_checks.fd_covariance", kind="theorem"),
    Claim("FD.residual", _FD, "||A(I-P)||_op <= sqrt(eps) + eta (Davis-Kahan).", "004 draft",
          "kvbounds.theory.frequent_directions:residual_bound", "kvbounds.proofs_checks.fd_residual", kind="lemma"),
    Claim("SUB.softmax-sensitivity", _FD, "||alpha - alpha_hat||_1 <= 2 tanh(||l - l_hat||_inf/2); tightness.", "004 draft",
          "kvbounds.theory.subspace:softmax_sensitivity_bound", "kvbounds.proofs_checks.sub_softmax_sensitivity", kind="lemma"),
    Claim("SUB.logit-error", _FD, "||l - l_hat||_inf <= (gamma_B/sqrt d) ||Delta K||_op ||q||.", "004 draft",
          "kvbounds.theory.subspace:logit_error_bound", "kvbounds.proofs_checks.sub_logit_error", kind="lemma"),
    Claim("SUB.output-error", _FD, "||o - o_hat|| <= 2 tanh(||l-l_hat||_inf/2) max||v_i|| + ||Delta V||_op; multi-chunk.",
          "004 draft",
          "kvbounds.theory.subspace:output_error_bound", "kvbounds.proofs_checks.sub_output_error", kind="lemma"),
    Claim("SUB.blockwise", _FD, "One-pass blockwise softmax across chunks equals softmax over the concatenation; stable.",
          "004 draft",
          "kvbounds.theory.subspace:blockwise_softmax_identity", "kvbounds.proofs_checks.sub_blockwise", kind="algorithm property"),
    Claim("SUB.cost", _FD, "Per-token FLOPs/bytes model vs measurement.", "004 draft",
          "kvbounds.theory.subspace:cost_model", "kvbounds.proofs_checks.sub_cost", kind="cost"),
    Claim("SUB.lowrank", _FD, "Empirical low-rank KV hypothesis and its four falsifiers.", "004 draft",
          "kvbounds.theory.subspace:energy_at_rank", "kvbounds.proofs_checks.sub_lowrank", kind="empirical"),
    Claim("BKV.e2e", _BKV, "End to end: compressing the prefill cache to ~0.25, BalanceKV's average quality is at least "
          "uniform sampling's and above StreamingLLM, SnapKV and PyramidKV; retrieval of a needle survives compression. "
          "Checked inside a real model (perplexity, passkey, line retrieval), each BalanceKV variant.",
          "BalanceKV: KV Cache Compression through Discrepancy Theory (arXiv:2502.07861, later version), "
          "Sec. 4.2-4.3, Table 1, needle test", "kvbounds.e2e.checks:equal_memory_baseline", "kvbounds.proofs_checks.bkv_e2e",
          kind="empirical"),
    Claim("SG.e2e", _SG, "End to end: on LongEval-style line retrieval, greedy k-center (ClusterGen) with recent tokens "
          "is more accurate than the other compressors at the same memory budget.",
          "SubGen: Token Generation in Sublinear Time and Memory (arXiv:2402.06082), Table 1; ClusterGen: Token "
          "Generation in Sublinear Time and Memory with Clustering KV Cache (anonymous submission), Table 2",
          "kvbounds.e2e.checks:equal_memory_baseline", "kvbounds.proofs_checks.sg_e2e", kind="empirical"),
]}


def get_claim(claim_id: str) -> Claim:
    try:
        return CLAIMS[claim_id]
    except KeyError:
        raise KeyError(f"unknown claim id {claim_id!r}; known ids: {', '.join(CLAIMS)}") from None


def checked_claims() -> list[Claim]:
    return [c for c in CLAIMS.values() if c.has_check]
