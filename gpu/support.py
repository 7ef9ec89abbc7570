"""Which checks have a GPU path: ``kvbounds check --backend torch:cuda|cupy`` says, per claim, whether its
trials put their arrays on the device or run on CPU whatever the backend.

A check "has a GPU path" when its ``run_trial(params, seed, backend)`` moves the data to ``backend``
(:func:`kvbounds.algorithms.arrays.asarray`) and calls the algorithms on those arrays; the algorithms are written
against the array API, so the work then runs on the GPU. The table was read off ``proofs_checks/*.py``
(Nov 2026); a claim missing from it (a check added later) is reported as not classified.
"""
from __future__ import annotations

# claim id -> (GPU path?, why)
GPU_SUPPORT: dict[str, tuple[bool, str]] = {
    "SBW.balance": (False, "vector-form walk in numpy, O(n d) per walk: too small to gain from a GPU"),
    "SBW.kernel-identity": (False, "exact arithmetic (sympy) and small numpy vectors; backend-independent"),
    "SB.discrepancy": (True, "SoftmaxBalance (Gram panels, batched over repeats) on the backend's arrays; the gpu "
                             "profile's walks with n > 2^16 run only on torch:cuda or cupy (deferred on a CPU backend)"),
    "SB.cost": (True, "times SoftmaxBalance on the backend; its memory sub-check (tracemalloc) runs on numpy only"),
    "MR.error": (True, "MergeAndReduce on the backend; the gpu profile's t-large sweep (t > 2^15) runs only on "
                       "torch:cuda or cupy (deferred on a CPU backend)"),
    "MR.memory": (True, "MergeAndReduce streamed on the backend's arrays"),
    "BKV.attention": (True, "BalanceKV (streaming) on the backend's arrays"),
    "BKV.memory": (True, "BalanceKV (streaming) on the backend's arrays; the gpu profile's n sweep (to 2^20) runs "
                         "on the host's numpy path (one token per step: launch-bound on a GPU), n > 2^16 deferred "
                         "on a CPU backend"),
    "BKV.vs-uniform": (False, "real-trace experiment (run_experiment) in numpy/float64 on CPU; the batched GPU "
                              "walk is kvbounds.gpu.batched_walk, timed by benchmarks/bench_gpu.py"),
    "BKV.ablation": (False, "real-trace block-size ablation in numpy on CPU"),
    "LB.index": (True, "the attention instances of the reduction run on the backend"),
    "NORM.bounded": (False, "statistics of real-model traces, numpy on CPU"),
    "SG.reservoir": (True, "SubGen's reservoirs fed the backend's arrays"),
    "SG.clusters": (True, "SubGen's online clustering fed the backend's arrays"),
    "SG.partition": (True, "SubGen streamed on the backend's arrays"),
    "SG.matprod": (True, "SubGen streamed and queried on the backend's arrays"),
    "SG.attention": (True, "SubGen accuracy and per-token cost on the backend (per-token steps are small: "
                           "launch-bound on a GPU)"),
    "SG.clusterability": (False, "clusterability statistics of real-model traces, numpy on CPU"),
    "FD.covariance": (True, "Frequent Directions updates on the backend's arrays"),
    "FD.residual": (True, "Frequent Directions updates on the backend's arrays"),
    "SUB.softmax-sensitivity": (False, "closed-form and small numpy instances; backend-independent"),
    "SUB.logit-error": (True, "subspace basis, calibration and logits on the backend"),
    "SUB.output-error": (True, "subspace attention outputs on the backend"),
    "SUB.blockwise": (True, "blockwise softmax merge on the backend's arrays"),
    "SUB.cost": (True, "operation counts of the coefficient decode and the exact decode on the backend's arrays; "
                       "the timing sub-check runs on numpy only"),
    "SUB.lowrank": (False, "spectra of real-model traces, numpy on CPU"),
    "BKV.decode": (False, "SmolLM2 generates on the CPU with the streaming press (torch, batched over layers and "
                          "heads); the backend argument is ignored"),
    "SG.decode": (False, "SmolLM2 generates on the CPU with the streaming press (torch, batched over layers and "
                         "heads); the backend argument is ignored"),
}


def gpu_support(claim_id: str) -> tuple[bool, str]:
    """(True, why) when the claim's check runs its arrays on a GPU backend, else (False, why it runs on CPU)."""
    from kvbounds.algorithms.arrays import input_error
    if not isinstance(claim_id, str):
        raise input_error(f"claim_id must be a string, got {type(claim_id).__name__}", type_error=True)
    if claim_id in GPU_SUPPORT:
        return GPU_SUPPORT[claim_id]
    return False, "not classified for GPU: runs as its check's run_trial decides (assume CPU)"


def describe(claim_ids, backend: str) -> list[str]:
    """One line per claim for ``kvbounds check --backend <gpu backend>``: 'ID: GPU' or 'ID: CPU (why)'."""
    from kvbounds.algorithms.validation import InputError
    from kvbounds.algorithms.arrays import validate_backend
    if isinstance(claim_ids, str) or not hasattr(claim_ids, "__iter__"):
        raise InputError(f"claim_ids must be a list of claim ids, got {type(claim_ids).__name__}")
    validate_backend(backend)
    out = []
    for cid in claim_ids:
        ok, why = gpu_support(cid)
        out.append(f"{cid}: {'on ' + backend if ok else 'on CPU'} ({why})")
    return out
