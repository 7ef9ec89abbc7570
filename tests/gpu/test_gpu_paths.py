"""``kvbounds check --backend torch:cuda|cupy`` in miniature: every check that kvbounds.gpu.support says has a GPU
path runs its smoke trials on the backend fixture (torch:cpu here; CUDA and CuPy where present) and records what
numpy records: the same checks, the same verdict per record, the same measurements up to the floats' rounding
(timings excepted). On torch:cpu the backend fixture makes implicit numpy conversions of tensors raise, as they do
for CUDA tensors."""
import math

import pytest


from kvbounds.claims import checked_claims, get_claim
from kvbounds.run import Trial, execute_trial

GPU_CLAIMS = [c.id for c in checked_claims() if c.gpu and c.gpu[0]]
TIMING_WORDS = ("time", "update")        # "step time", "time gram", "fd update" (us per row): clock readings


def _by_check(records):
    out, seen = {}, {}
    for r in records:
        i = seen[r.check] = seen.get(r.check, -1) + 1
        out[(r.check, i)] = r
    return out


@pytest.mark.parametrize("claim_id", GPU_CLAIMS)
def test_gpu_path_records_match_numpy(claim_id, backend, smoke_store):
    if backend == "numpy":
        pytest.skip("numpy is the reference")
    mod = get_claim(claim_id).check_module()
    numpy_records = smoke_store.records(claim_id)      # the session's numpy smoke run (conftest.SmokeStore)
    for params in mod.trials("smoke"):
        ref = _by_check([r for r in numpy_records if r.key == Trial(claim_id, params, 0, "numpy").key])
        got = _by_check(execute_trial(Trial(claim_id, params, 0, backend)))
        assert got and set(got) <= set(ref), (params, sorted(set(got) - set(ref)))
        for key, r in got.items():
            want = ref[key]
            # rounding-level measurements (errors of ~1e-16 in the bound's units) differ between BLAS and cuBLAS
            close = lambda a, b: math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9 * max(1.0, abs(want.bound)))
            assert r.holds == want.holds and close(r.bound, want.bound), (params, key, r.bound, want.bound)
            if not any(w in r.check for w in TIMING_WORDS):
                assert close(r.measured, want.measured), (params, key, r.measured, want.measured)
