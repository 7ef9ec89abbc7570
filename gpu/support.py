"""Which checks have a GPU path: ``kvbounds check --backend torch:cuda|cupy`` says, per claim, whether its
trials put their arrays on the device or run on CPU whatever the backend.

A check "has a GPU path" when its ``run_trial(params, seed, backend)`` moves the data to ``backend``
(:func:`kvbounds.algorithms.arrays.asarray`) and calls the algorithms on those arrays; the algorithms are written
against the array API, so the work then runs on the GPU. The classification was read off ``proofs_checks/*.py``
and is kept in each claim's registry entry (``Claim.gpu``, :mod:`kvbounds.claims`); a claim without it is reported
as not classified.
"""
from __future__ import annotations
from kvbounds.algorithms.arrays import input_error
from kvbounds.claims import CLAIMS
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import validate_backend

__all__ = ["gpu_support", "describe"]

def gpu_support(claim_id: str) -> tuple[bool, str]:
    """(True, why) when the claim's check runs its arrays on a GPU backend, else (False, why it runs on CPU)."""
    if not isinstance(claim_id, str):
        raise input_error(f"claim_id must be a string, got {type(claim_id).__name__}", type_error=True)
    claim = CLAIMS.get(claim_id)
    if claim is not None and claim.gpu is not None:
        return claim.gpu
    return False, "not classified for GPU: runs as its check's run_trial decides (assume CPU)"


def describe(claim_ids, backend: str) -> list[str]:
    """One line per claim for ``kvbounds check --backend <gpu backend>``: 'ID: GPU' or 'ID: CPU (why)'."""
    if isinstance(claim_ids, str) or not hasattr(claim_ids, "__iter__"):
        raise InputError(f"claim_ids must be a list of claim ids, got {type(claim_ids).__name__}")
    validate_backend(backend)
    out = []
    for cid in claim_ids:
        ok, why = gpu_support(cid)
        out.append(f"{cid}: {'on ' + backend if ok else 'on CPU'} ({why})")
    return out
