"""The claim registry: one entry per claim, the one home of every fact about it.

A claim is data: its statement, its source (paper, version and theorem, as a reader finds them; see
``PAPERS``), its kind, the dotted path of its bound function in ``kvbounds.theory``, the dotted path of its check
module in ``kvbounds.proofs_checks``, the method its power table speaks for (``algorithm``), whether its check runs
its arrays on a GPU backend and why (``gpu``), whether the runner submits its trials first (``schedule_first``) and
whether it has trials in the ``gpu`` profile (``gpu_profile``). Everything else (the runner, the report, the CLI,
:mod:`kvbounds.gpu.support`, :mod:`kvbounds.battery`, the tests) reads these entries. An entry whose check module
does not exist yet is listed as "no check". A new claim can also live in its check module alone: a module of
``kvbounds.proofs_checks`` that calls :func:`register_claim` (and :func:`register_paper` for a new paper) is
imported when the registry loads (:func:`load_check_modules`); from outside the package, the entry-point group
``kvbounds.claims`` names such modules (importing each registers its claims).

A check module exposes
    ``CLAIM``                          the claim id it checks,
    ``trials(profile) -> list[dict]``  the parameter grid of the profile ("smoke", "quick", "full"; "gpu" when the
                                       claim has ``gpu_profile``),
    ``run_trial(params, seed, backend) -> Record | list[Record]``,
    ``summarize(records) -> Verdict``  the claim-level verdict from all its records,
and optionally ``leaderboard_rows(records) -> list[dict]``, its rows of the end-to-end leaderboard, and
``LONG_SWEEPS``, the values of ``params["sweep"]`` whose trials are long (a scale sweep's units: the runner submits
them first, as it does every trial of a ``schedule_first`` claim). Its records
cite the part of the claim's source each sub-check reads (``Record.source``); the claim's own source is the
entry's. The recipe for a new claim: docs/EXTENDING.md.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import re
import sys
from types import ModuleType
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Paper:
    """A source as a reader finds it. ``short`` is the name used in sources and in the report."""
    short: str
    title: str
    where: str          # arXiv id and version, venue, or "unpublished"
    note: str = ""
    url: str = ""       # where a reader finds it (arXiv abstract page), when public

    def citation(self) -> str:
        return f'{self.short}: "{self.title}", {self.where}' + (f" ({self.note})" if self.note else "")


# The papers, keyed by their short names (the names every source text uses).
PAPERS: dict[str, Paper] = {p.short: p for p in [
    Paper("BalanceKV-preprint", "BalanceKV: KV Cache Compression through Discrepancy Theory",
                 "arXiv 2502.07861, early preprint (v1; the paper was later retitled \"Streaming Attention "
                 "Approximation via Discrepancy Theory\")",
                 "numbering: Thm 3.1 BalanceKV, Thm 3.2 SoftmaxBalance, Thm 3.3 MergeAndReduce, "
                 "Thm 3.4 self-balancing walk; Alg. 1-4 in the same order", "https://arxiv.org/abs/2502.07861v1"),
    Paper("BalanceKV-NeurIPS", "Streaming Attention Approximation via Discrepancy Theory",
                 "arXiv 2502.07861, NeurIPS 2025 version",
                 "adds the space lower bound (Thm 3.2, App. C) and more experiments; Thm 3.3 SoftmaxBalance, "
                 "Thm 3.4 MergeAndReduce, Thm A.1 self-balancing walk", "https://arxiv.org/abs/2502.07861"),
    Paper("SubGen", "SubGen: Token Generation in Sublinear Time and Memory", "arXiv 2402.06082",
                 url="https://arxiv.org/abs/2402.06082"),
    Paper("ClusterGen", "ClusterGen: Token Generation in Sublinear Time and Memory with Clustering KV Cache",
                 "later conference submission of SubGen (under double-blind review)",
                 "same algorithm; Lemma 2.2, Lemma 2.3, Thm 2.4 match SubGen's Lemma 1, Lemma 2, Thm 1"),
    Paper("Subspace-FD-draft", "Online Subspace Projection for KV Caches: Training-Free Low-Rank "
                 "Attention at Inference Time", "unpublished draft with its review (major revisions)",
                 "Sec. 8 error guarantees, Sec. 6 blockwise softmax, Sec. 9 roofline, Sec. 11 falsifiers"),
]}
# the labels older records cite the papers by ("001 Thm 3.3"), read by ``cite``
_OLD_LABELS = {"000": "BalanceKV-preprint", "001": "BalanceKV-NeurIPS", "002": "SubGen", "003": "ClusterGen",
               "004": "Subspace-FD-draft"}
_LABEL = re.compile(r"(?<![\w.])(00[0-4])(?=[ ,;:)'\u2019]|$)")


# BalanceKV-preprint's LaTeX labels, as older records and texts cite them, and the numbers its readers see
_LATEX_LABELS = {"thm:main-theorem": "Thm 3.1", "thm:BALANCE-vectors": "Thm 3.2", "thm:MergeAndReduce": "Thm 3.3",
                 "thm:BALANCE-ALS21": "Thm 3.4", "alg:main": "Alg. 1", "alg:BALANCE-V": "Alg. 2",
                 "alg:merge_reduce": "Alg. 3", "alg:BALANCE": "Alg. 4"}
_LATEX = re.compile("|".join(re.escape(k) for k in sorted(_LATEX_LABELS, key=len, reverse=True)) + r"(?![\w-])")


def cite(text: str) -> str:
    """Replace the old three-digit labels of the papers (as stored records written before the short names cite
    them) by the papers' short names ("BalanceKV-NeurIPS Thm 3.3"), and BalanceKV-preprint's LaTeX labels by its
    theorem and algorithm numbers ("Thm 3.3"); text that already names the papers is returned unchanged."""
    return _LATEX.sub(lambda m: _LATEX_LABELS[m.group(0)], _LABEL.sub(lambda m: _OLD_LABELS[m.group(1)], text))


def register_paper(paper: Paper) -> Paper:
    """Add a paper (a new claim's source) under its short name; the same paper again is a no-op."""
    if not isinstance(paper, Paper):
        raise TypeError(f"register_paper takes a Paper, got {type(paper).__name__}")
    if PAPERS.get(paper.short, paper) != paper:
        raise ValueError(f"a different paper is registered as {paper.short!r}")
    PAPERS[paper.short] = paper
    return paper


def papers_in(source: str) -> list[Paper]:
    """The papers a claim's source text names, in PAPERS order."""
    return [p for p in PAPERS.values() if re.search(rf"\b{re.escape(p.short)}\b", source)]


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    family: str
    statement: str
    source: str
    bound: str = ""   # "module:function" in theory/
    check: str = ""   # module in proofs_checks/
    kind: str = "theorem"   # theorem | lemma | algorithm property | cost | empirical (the verdict rules differ by kind)
    algorithm: str = ""     # the method its power table ("does it beat doing nothing") speaks for, as the report names it
    # the variant its empirical sentences (fitted constant, rate, power) are measured on, as "algorithm:variant" of
    # kvbounds.methods.VARIANT_WORDS (the headline names it); "" where the check names each variant itself or the
    # claim is about a walk, a cost or the data alone
    variant: str = ""
    gpu: tuple[bool, str] | None = None   # (runs its arrays on a GPU backend?, why); None: not classified
    schedule_first: bool = False   # long trials (a real model's forward passes): the runner submits them first
    gpu_profile: bool = False      # has trials in the "gpu" profile (its scale sweeps)

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
_BN, _BP = "BalanceKV-NeurIPS", "BalanceKV-preprint"

CLAIMS: dict[str, Claim] = {c.id: c for c in [
    Claim("SBW.balance", _BKV,
          "Self-balancing walk (Alweiss, Liu and Sawhney 2021, Thm 1.1, as restated): given vectors u_1..u_n with "
          "||u_i|| <= r and failure probability delta, the walk with c = 30 log(n/delta) splits them into U' and its "
          "complement so that, for any fixed direction u, |sum_{i in U'} <u_i,u> - sum_{i not in U'} <u_i,u>| "
          "<= O(log(n/delta) max_i ||u_i|| ||u||) with probability >= 1 - delta; the walk reports FAIL "
          "(|<w,u_i>| > c r^2) with probability <= delta. Checked also: the discrepancy's growth in n against "
          "independent random signs (which grow like sqrt(n)).",
          f"{_BN} Thm A.1, Alg. 3 (Self-Balancing Walk); {_BP} Thm 3.4, Alg. 4",
          "kvbounds.theory.balancekv:sbw_discrepancy_shape", "kvbounds.proofs_checks.sbw_balance", kind="theorem",
          gpu=(False, 'vector-form walk in numpy, O(n d) per walk: too small to gain from a GPU')),
    Claim("SBW.kernel-identity", _BKV,
          "The feature map phi(k) = ((k/d^{1/4})^{(x)i} / sqrt(i!))_{i>=0} satisfies <phi(k),phi(q)> = "
          "exp(<k,q>/sqrt d) and ||phi(k)||^2 = exp(||k||^2/sqrt d), which turns the softmax kernel into an inner "
          "product for the walk; the truncation of phi to degree m has an explicit (Lagrange) tail bound.",
          f"{_BN} App. A.2 (proof of Thm 3.3); {_BP} proof of Thm 3.2",
          "kvbounds.theory.kernel_identity:truncation_tail_bound", "kvbounds.proofs_checks.sbw_kernel_identity", kind="lemma",
          gpu=(False, 'exact arithmetic (sympy) and small numpy vectors; backend-independent')),
    Claim("SB.discrepancy", _BKV,
          "SoftmaxBalance: given keys k_1..k_n in R^d, values v_1..v_n in R^s and failure probability delta, it "
          "returns C' with |C'| <= |C|/2 such that for any query q, with probability >= 1 - delta, "
          "||sum_{C'} e^{<k,q>/sqrt d} v - sum_{C \\ C'} e^{<k,q>/sqrt d} v|| <= O(sqrt(s) log(ns/delta) "
          "e^{||q||^2/(2 sqrt d)} e^{max_i ||k_i||^2/(2 sqrt d)} max_i ||v_i||).",
          f"{_BN} Thm 3.3, Alg. 2; {_BP} Thm 3.2, Alg. 2",
          "kvbounds.theory.balancekv:softmax_balance_shape", "kvbounds.proofs_checks.sb_discrepancy", kind="theorem",
          gpu=(True, "SoftmaxBalance (Gram panels, batched over repeats) on the backend's arrays; the scale sweep's "
                     "units with n > 2^17 (gpu profile) run only on torch:cuda or cupy (deferred on a CPU backend)"),
          gpu_profile=True),
    Claim("SB.cost", _BKV,
          "SoftmaxBalance on n keys in R^d with values in R^s runs in O((d+s) n^2) time and O((d+s) n) memory.",
          f"{_BN} Thm 3.3; {_BP} Thm 3.2",
          "kvbounds.theory.balancekv:softmax_balance_cost", "kvbounds.proofs_checks.sb_cost", kind="cost",
          gpu=(True, 'times SoftmaxBalance on the backend; its memory sub-check (tracemalloc) runs on numpy only')),
    Claim("MR.error", _BKV,
          "MergeAndReduce with batch size t = O~(sqrt(s) e^{2r^2/sqrt d}/eps) (NeurIPS version; the preprint states "
          "t = O*(e^{2r^2/sqrt d}/eps)) and T = log2(n/t) levels, for tokens with ||q_j||, ||k_j|| <= r: at every "
          "step j, ||sum_{i<=j} e^{<k_i,q_j>/sqrt d} v_i - z_j|| <= eps j e^{-r^2/sqrt d} max_i ||v_i||, where "
          "z_j = sum_i 2^i sum_{C^i} e^{<k,q_j>/sqrt d} v is the estimate from the occupied cells C^0..C^T.",
          f"{_BN} Thm 3.4, Alg. 4; {_BP} Thm 3.3, Alg. 3",
          "kvbounds.theory.balancekv:merge_reduce_error_bound", "kvbounds.proofs_checks.mr_error", kind="theorem",
          algorithm="MergeAndReduce",
          variant="BalanceKV:pseudocode",
          gpu=(True, "MergeAndReduce on the backend; the scale sweep's units with t > 2^16 (gpu profile) run only "
                     "on torch:cuda or cupy (deferred on a CPU backend)"),
          gpu_profile=True),
    Claim("MR.memory", _BKV,
          "MergeAndReduce keeps at most log2(n/t) occupied cells, each with |C^i| <= t tokens; its total memory is "
          "O(d t log(n/t)) and its time per step O~(d s e^{4r^2/sqrt d}/eps^2).",
          f"{_BN} Thm 3.4, Alg. 4; {_BP} Thm 3.3, Alg. 3",
          "kvbounds.theory.balancekv:merge_reduce_memory_bound", "kvbounds.proofs_checks.mr_memory", kind="cost",
          gpu=(True, "MergeAndReduce streamed on the backend's arrays")),
    Claim("BKV.attention", _BKV,
          "BalanceKV: for any r, eps > 0 and tokens (q_j, k_j, v_j) with ||q_j||, ||k_j|| <= r, at every step j the "
          "output z_j satisfies ||z_j - Attn(q_j, K_j, V_j)|| <= eps ||softmax(K_j q_j/sqrt d)|| ||V_j||_F with "
          "probability >= 1 - 1/poly(n), where Attn(q, K, V) = softmax(K q/sqrt d)^T V.",
          f"{_BN} Thm 3.1, Alg. 1; {_BP} Thm 3.1, Alg. 1",
          "kvbounds.theory.balancekv:balance_kv_error_bound", "kvbounds.proofs_checks.bkv_attention", kind="theorem",
          algorithm="BalanceKV (pseudocode)",
          variant="BalanceKV:pseudocode",
          gpu=(True, "BalanceKV (streaming) on the backend's arrays")),
    Claim("BKV.memory", _BKV,
          "BalanceKV's total memory is O~(d sqrt(d) e^{2r^2/sqrt d}/eps) (NeurIPS version) / O*(e^{2r^2/sqrt d}/eps) "
          "(preprint); the number of live value-norm buckets is O(log n); and the small-norm buckets that Alg. 1 "
          "line 8 erases contribute at most the share of the error the proof allows (compare line 8's threshold "
          "with the one used in the proof, App. A.1).",
          f"{_BN} Thm 3.1, Alg. 1 line 8, App. A.1; {_BP} Thm 3.1",
          "kvbounds.theory.balancekv:balance_kv_memory_shape", "kvbounds.proofs_checks.bkv_memory", kind="cost",
          gpu=(True, "BalanceKV (streaming) on the backend's arrays; the scale sweep (to 2^17 on full, 2^20 on gpu) "
                     "runs on the host's numpy path (one token per step: launch-bound on a GPU), units with n > 2^17 "
                     "deferred on a CPU backend"),
          gpu_profile=True),
    Claim("BKV.vs-uniform", _BKV,
          "Empirical: at equal memory, BalanceKV's relative attention error ||z - Attn|| / ||Attn|| is lower than "
          "that of independent uniform sampling of the cache (setup: the first and last tokens kept exactly, the "
          "middle compressed to a 2^-T fraction, T = 1..4, per layer of a real model).",
          f"{_BN} Sec. 4.1, Fig. 1, App. B.1; {_BP} Sec. 4.1",
          "kvbounds.theory.empirical:relative_error", "kvbounds.proofs_checks.bkv_vs_uniform", kind="empirical",
          algorithm="BalanceKV (single-layer experiment)",
          gpu=(False, 'real-trace experiment (run_experiment) in numpy/float64 on CPU; the batched GPU walk is '
                      'kvbounds.gpu.batched_walk, timed by benchmarks/bench_gpu.py')),
    Claim("BKV.ablation", _BKV,
          "Empirical: BalanceKV's relative attention error falls and its compression runtime rises as the batch "
          "size (block size) grows, at each compression level.",
          f"{_BN} Fig. 3, App. B.1",
          "kvbounds.theory.empirical:relative_error", "kvbounds.proofs_checks.bkv_ablation", kind="empirical",
          gpu=(False, 'real-trace block-size ablation in numpy on CPU')),
    Claim("LB.index", _BKV,
          "Space lower bound: for r^2 <= d, any streaming algorithm that meets the attention guarantee (eq. 2) with "
          "probability 0.999 needs Omega(min{1/eps^2, d e^{2r^2/sqrt d}}) space, by reduction from INDEX. "
          "Checked: Lemma C.3 (E exp(C<x,y>/sqrt d) = cosh(C r^2/d^{3/2})^d and its bounds) exactly; Lemmas C.4, "
          "C.6 and Corollary C.5 by Monte Carlo; and the reduction played as a game (Alice encodes bits as key/value "
          "pairs, Bob decodes bit i from an attention estimate).",
          f"{_BN} Thm 3.2, App. C (Lemmas C.3-C.6, Cor. C.5)",
          "kvbounds.theory.lower_bound:space_lower_bound", "kvbounds.proofs_checks.lb_index", kind="theorem",
          gpu=(True, 'the attention instances of the reduction run on the backend')),
    Claim("NORM.bounded", _BKV,
          "Empirical: the norms of queries, keys and values concentrate around per-layer constants and do not grow "
          "with the sequence length (the premise ||q||, ||k|| <= r of the theorems).",
          f"{_BN} App. B.5, Table 3; ClusterGen Table 1",
          "kvbounds.theory.empirical:norm_interval", "kvbounds.proofs_checks.norm_bounded", kind="empirical",
          gpu=(False, 'statistics of real-model traces, numpy on CPU')),
    Claim("SG.reservoir", _SG,
          "The value sampler (UpdateMatrixProduct): after n tokens the list M holds s i.i.d. samples with "
          "Pr[M(j) = (k_i, v_i)] = ||v_i||^2 / sum_l ||v_l||^2 for every j. (ClusterGen's prose says ||k_i||^2; "
          "the algorithm uses ||v_i||^2; the check says which law holds.)",
          "SubGen Lemma 1, Alg. 1; ClusterGen Lemma 2.2",
          "kvbounds.theory.subgen:reservoir_probability", "kvbounds.proofs_checks.sg_reservoir", kind="lemma",
          gpu=(True, "SubGen's reservoirs fed the backend's arrays")),
    Claim("SG.clusters", _SG,
          "The streaming clustering (UpdateSoftmaxNormalizer) keeps, at every step, centres x_i and clusters C_i "
          "with (1) x_i in C_i, (2) n_i = |C_i|, (3) ||x_i - k'|| <= delta for k' in C_i, (4) ||x_i - x_j|| > delta "
          "for i != j, (5) S_i holds t i.i.d. uniform samples of C_i; and if the keys are (m, delta)-clusterable "
          "(Definition 1) the number of clusters is m' <= m.",
          "SubGen Lemma 2, Definition 1; ClusterGen Lemma 2.3",
          "kvbounds.theory.subgen:cluster_count_bound", "kvbounds.proofs_checks.sg_clusters", kind="lemma",
          gpu=(True, "SubGen's online clustering fed the backend's arrays")),
    Claim("SG.partition", _SG,
          "Partition function: with t = Omega(eps^-2 e^{2 delta r} log n) samples per cluster, the estimate tau lies in "
          "(1 +- eps/3) sum_j exp(<k_j, q>) with probability >= 0.995 (SubGen writes attention without 1/sqrt d).",
          "SubGen Thm 1, Lemma 2; ClusterGen Thm 2.4",
          "kvbounds.theory.subgen:partition_bound", "kvbounds.proofs_checks.sg_partition", kind="theorem",
          algorithm="SubGen normaliser (partition function)",
          variant="SubGen/ClusterGen:subgen",
          gpu=(True, "SubGen streamed on the backend's arrays")),
    Claim("SG.matprod", _SG,
          "Matrix product: with s = Omega(eps^-2 d) value samples, ||z - exp(K q)^T V|| <= (eps/3) ||exp(K q)|| "
          "||V||_op with probability >= 0.995.",
          "SubGen Thm 1, Lemma 1; ClusterGen Thm 2.4",
          "kvbounds.theory.subgen:matprod_bound", "kvbounds.proofs_checks.sg_matprod", kind="theorem",
          algorithm="SubGen l2 sampling (matrix product)",
          variant="SubGen/ClusterGen:subgen",
          gpu=(True, "SubGen streamed and queried on the backend's arrays")),
    Claim("SG.attention", _SG,
          "SubGen: for (m, delta)-clusterable keys with ||q||, ||k|| <= r, the output satisfies ||z/tau - Attn|| <= "
          "eps ||softmax(K q)|| ||V||_op with probability >= 0.99, using memory and time per step O(d (m t + s)).",
          "SubGen Thm 1; ClusterGen Thm 2.4",
          "kvbounds.theory.subgen:attention_bound", "kvbounds.proofs_checks.sg_attention", kind="theorem",
          algorithm="SubGen",
          variant="SubGen/ClusterGen:subgen",
          gpu=(True, 'SubGen accuracy and per-token cost on the backend (per-token steps are small: launch-bound on '
                     'a GPU)')),
    Claim("SG.clusterability", _SG,
          "Empirical: cached keys are more clusterable than values (smaller k-center radius at the same k), and "
          "the keys of RoPE models are more clusterable than those of absolute-position models.",
          "ClusterGen Sec. 3.1, Table 1, Fig. 1",
          "kvbounds.theory.subgen:kcenter_radius", "kvbounds.proofs_checks.sg_clusterability", kind="empirical",
          gpu=(False, 'clusterability statistics of real-model traces, numpy on CPU')),
    Claim("FD.covariance", _FD,
          "Frequent Directions: for a sketch S of A with l rows and any r < l, A^T A - S^T S is positive semidefinite "
          "and ||A^T A - S^T S||_op <= ||A - A_r||_F^2 / (l - r), where A_r is the best rank-r approximation of A "
          "(Liberty 2013; Ghashami, Liberty, Phillips and Woodruff 2016).",
          "Subspace-FD-draft Sec. 8 (FD linkage)",
          "kvbounds.theory.frequent_directions:covariance_bound", "kvbounds.proofs_checks.fd_covariance", kind="theorem",
          algorithm="Frequent Directions",
          variant="Subspace/FD:fd",
          gpu=(True, "Frequent Directions updates on the backend's arrays")),
    Claim("FD.residual", _FD,
          "With P the projector onto the top-r right singular space of the FD sketch S and "
          "eps = ||A - A_r||_F^2/(l - r): ||A (I - P)||_op <= sqrt(eps) + eta, with eta the subspace perturbation "
          "between the sketch's and A's top-r spaces (bounded by Davis-Kahan through eps and the spectral gap).",
          "Subspace-FD-draft Sec. 8 (FD linkage)",
          "kvbounds.theory.frequent_directions:residual_bound", "kvbounds.proofs_checks.fd_residual", kind="lemma",
          algorithm="Frequent Directions (top-r space)",
          variant="Subspace/FD:fd",
          gpu=(True, "Frequent Directions updates on the backend's arrays")),
    Claim("SUB.softmax-sensitivity", _FD,
          "Softmax sensitivity: for logits l and l_hat, ||softmax(l) - softmax(l_hat)||_1 <= 2 tanh(||l - l_hat||_inf / 2) "
          "(<= ||l - l_hat||_inf), and the bound is tight in l_inf.",
          "Subspace-FD-draft Sec. 8",
          "kvbounds.theory.subspace:softmax_sensitivity_bound", "kvbounds.proofs_checks.sub_softmax_sensitivity", kind="lemma",
          gpu=(False, 'closed-form and small numpy instances; backend-independent')),
    Claim("SUB.logit-error", _FD,
          "Logit error: for projected logits l_hat_i = gamma_B q^T P_B k_i / sqrt d and Delta K = K (I - P_B), "
          "||l - l_hat||_inf <= (gamma_B / sqrt d) ||Delta K||_op ||q|| for any q (the draft's default "
          "gamma_B = sqrt(r/d); the check covers the default and other gamma_B).",
          "Subspace-FD-draft Sec. 4, Sec. 8",
          "kvbounds.theory.subspace:logit_error_bound", "kvbounds.proofs_checks.sub_logit_error", kind="lemma",
          algorithm="static subspace logits (rank 8)",
          variant="Subspace/FD:subspace",
          gpu=(True, 'subspace basis, calibration and logits on the backend')),
    Claim("SUB.output-error", _FD,
          "Output error: ||o - o_hat|| <= 2 tanh(||l - l_hat||_inf / 2) max_i ||v_i|| + ||Delta V||_op with "
          "Delta V = V (I - P_E); and the multi-chunk version with chunk projectors P_{B_j}, P_{E_j}: "
          "||o - o_hat|| <= 2 tanh((gamma_B ||q|| / (2 sqrt d)) max_j ||K_j (I - P_{B_j})||_op) max_i ||v_i|| "
          "+ max_j ||V_j (I - P_{E_j})||_op.",
          "Subspace-FD-draft Sec. 8 (single basis and multi-chunk extension)",
          "kvbounds.theory.subspace:output_error_bound", "kvbounds.proofs_checks.sub_output_error", kind="lemma",
          algorithm="static subspace (rank 8)",
          variant="Subspace/FD:subspace",
          gpu=(True, 'subspace attention outputs on the backend')),
    Claim("SUB.blockwise", _FD,
          "The one-pass blockwise softmax across chunks with distinct bases (running max m, normaliser Z, numerator N) "
          "equals softmax over the concatenated logits (exactly, for exact logits) and is numerically stable: no "
          "overflow or NaN for any finite logits, masks included.",
          "Subspace-FD-draft Sec. 6 (correctness lemma, sketched)",
          "kvbounds.theory.subspace:blockwise_softmax_identity", "kvbounds.proofs_checks.sub_blockwise", kind="algorithm property",
          gpu=(True, "blockwise softmax merge on the backend's arrays")),
    Claim("SUB.cost", _FD,
          "Per-token cost per head: the baseline reads O(T d) bytes and does O(T d) FLOPs; coefficient-space attention "
          "does O(T (r + r_v)) + O((r + r_v) d) + O(d (l_k + l_v)) (the last term: FD updates), so it is faster when "
          "T >> d and r + r_v << d; the roofline model is compared with measured time.",
          "Subspace-FD-draft Sec. 4, Sec. 9",
          "kvbounds.theory.subspace:cost_model", "kvbounds.proofs_checks.sub_cost", kind="cost",
          gpu=(True, "operation counts of the coefficient decode and the exact decode on the backend's arrays; the"
                     " timing sub-check runs on numpy only")),
    Claim("SUB.lowrank", _FD,
          "Empirical (the Low-Rank KV Cache Hypothesis): per head and layer, the spectra of K and V decay fast; at "
          "r = d/4 many heads keep >= 90% of the energy; post-RoPE keys stay low-rank within chunks. The draft's four "
          "falsifiers: (1) no r << d keeps the perplexity increase <= 1%; (2) the adaptive subspace underperforms the "
          "static one at matched r; (3) error or quality degrades sharply with context length despite chunking; "
          "(4) FD eps and the operator-norm residuals fail to predict the observed logit/output errors.",
          "Subspace-FD-draft Sec. 11 (falsifiers), Sec. 12; review",
          "kvbounds.theory.subspace:energy_at_rank", "kvbounds.proofs_checks.sub_lowrank", kind="empirical",
          variant="Subspace/FD:subspace",
          gpu=(False, 'spectra of real-model traces, numpy on CPU'),
          schedule_first=True),
    Claim("BKV.e2e", _BKV, "End to end: compressing the prefill cache to ~0.25, BalanceKV's average quality is at least "
          "uniform sampling's and above StreamingLLM, SnapKV and PyramidKV; retrieval of a needle survives compression. "
          "Checked inside a real model (perplexity, passkey, line retrieval), each BalanceKV variant.",
          f"{_BN} Sec. 4.2-4.3, Table 1, needle test", "kvbounds.e2e._checks:equal_memory_baseline",
          "kvbounds.proofs_checks.bkv_e2e",
          kind="empirical",
          schedule_first=True),
    Claim("SG.e2e", _SG, "End to end: on LongEval-style line retrieval, greedy k-center (ClusterGen) with recent tokens "
          "is more accurate than the other compressors at the same memory budget.",
          "SubGen Table 1; ClusterGen Table 2",
          "kvbounds.e2e._checks:equal_memory_baseline", "kvbounds.proofs_checks.sg_e2e", kind="empirical",
          schedule_first=True),
    # decode-time claims (issue 23): the streaming theorems where they are meant to hold, inside generation
    Claim("BKV.decode", _BKV,
          "BalanceKV while a real model generates: with each layer's cache maintained as a stream (merge-and-reduce "
          "over weighted coresets at a fixed memory), at every step j each layer's output z_j satisfies "
          "||z_j - Attn(q_j, K_j, V_j)|| <= eps ||softmax(K_j q_j/sqrt d)|| ||V_j||_F against exact attention over "
          "the layer's whole history, with eps = O~(sqrt(d) e^{2r^2/sqrt d}/t) at memory t log(n/t).",
          f"{_BN} Thm 3.1, Alg. 1 (streaming, inside generation)",
          "kvbounds.theory.balancekv:balance_kv_error_bound", "kvbounds.proofs_checks.bkv_decode", kind="theorem",
          algorithm="BalanceKV (streaming, in generation)",
          variant="BalanceKV:streaming",
          gpu=(False, 'SmolLM2 generates on the CPU with the streaming press (torch, batched over layers and heads);'
                      ' the backend argument is ignored'),
          schedule_first=True),
    Claim("SG.decode", _SG,
          "SubGen while a real model generates: with each layer's cache maintained as a stream (online clusters "
          "with uniform samples, l2 samples of the values), at every step each layer's output satisfies "
          "||z/tau - Attn|| <= eps ||softmax(K q)|| ||V||_op against exact attention over the layer's whole history, "
          "with t = Omega(eps^-2 e^{2 delta r} log n) samples per cluster and s = Omega(eps^-2 d) value samples, "
          "for a query of norm ||q|| <= r and clusters of diameter delta.",
          "SubGen Thm 1, Alg. 1; ClusterGen Thm 2.4 (streaming, inside generation)",
          "kvbounds.theory.subgen:attention_bound", "kvbounds.proofs_checks.sg_decode", kind="theorem",
          algorithm="SubGen (streaming, in generation)",
          variant="SubGen/ClusterGen:streaming",
          gpu=(False, 'SmolLM2 generates on the CPU with the streaming press (torch, batched over layers and heads);'
                      ' the backend argument is ignored'),
          schedule_first=True),
]}


def get_claim(claim_id: str) -> Claim:
    """The claim with this id; ids match case-insensitively, and an unknown id names the closest ones."""
    if claim_id in CLAIMS:
        return CLAIMS[claim_id]
    folded = {cid.lower(): c for cid, c in CLAIMS.items()}
    if claim_id.lower() in folded:
        return folded[claim_id.lower()]
    close = difflib.get_close_matches(claim_id.lower(), list(folded), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(folded[c].id for c in close)}?" if close else \
        f"; known ids: {', '.join(CLAIMS)} (`kvbounds list`)"
    raise KeyError(f"unknown claim id {claim_id!r}{hint}") from None


def checked_claims() -> list[Claim]:
    return [c for c in CLAIMS.values() if c.has_check]


def register_claim(claim: Claim) -> Claim:
    """Add a claim from outside the package (its check module may live anywhere importable; ``claim.check`` names
    it). Every paper its source names must be in ``PAPERS`` (:func:`register_paper` first for a new one). The same
    claim again is a no-op; another claim under a registered id is an error."""
    if not isinstance(claim, Claim):
        raise TypeError(f"register_claim takes a Claim, got {type(claim).__name__}")
    if claim.check == "__main__" and _main_module_name():
        # `python -m kvbounds.proofs_checks.X`: the module running as __main__ is X, once (discovery skipped it)
        name = _main_module_name()
        sys.modules.setdefault(name, sys.modules["__main__"])
        claim = dataclasses.replace(claim, check=name)
    if CLAIMS.get(claim.id, claim) != claim:
        raise ValueError(f"a different claim is registered as {claim.id!r}")
    if not papers_in(claim.source):
        raise ValueError(f"the source of {claim.id!r} names no registered paper ({claim.source!r}); "
                         f"register_paper(Paper(...)) first")
    CLAIMS[claim.id] = claim
    return claim


def _main_module_name() -> str | None:
    """The name of the module running as ``__main__`` under ``python -m NAME`` (None for a script or a REPL)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None)


def load_check_modules() -> list[str]:
    """Import the check modules of :mod:`kvbounds.proofs_checks` that register their own claim (their source calls
    ``register_claim``), so that a claim added to the package is its check module alone; the package's first claims
    are the entries of ``CLAIMS`` above. Returns the modules imported; one that fails to import is skipped with a
    warning naming it."""
    import warnings
    from pathlib import Path
    pkg = importlib.import_module("kvbounds.proofs_checks")
    done = []
    for folder in list(pkg.__path__):
        for path in sorted(Path(folder).glob("*.py")):
            if "register_claim(" not in path.read_text(encoding="utf-8", errors="replace"):
                continue
            name = f"{pkg.__name__}.{path.stem}"
            if name == _main_module_name():          # it runs as __main__ (`python -m`) and registers itself
                continue
            try:
                importlib.import_module(name)
                done.append(name)
            except Exception as e:  # noqa: BLE001 - one broken module must not take the registry down
                warnings.warn(f"kvbounds: check module {name} failed to import: {e!r}")
    return done


def _load_entry_points(group: str = "kvbounds.claims") -> None:
    """Import every module the installed distributions name in the entry-point group (their imports register
    their claims); a module that fails to import is skipped with a warning naming it."""
    import warnings
    from importlib.metadata import entry_points
    for ep in entry_points(group=group):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - one broken plugin must not take the registry down
            warnings.warn(f"kvbounds: entry point {ep.name!r} ({ep.value}) of {group} failed to load: {e!r}")



load_check_modules()
_load_entry_points()
