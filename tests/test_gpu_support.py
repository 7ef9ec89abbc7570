"""gpu_support: one row per registered claim, each with a reason."""
import pytest

from kvbounds.gpu.support import GPU_SUPPORT, describe, gpu_support
from kvbounds.registry import CLAIMS


def test_every_checked_claim_is_classified():
    missing = [cid for cid, c in CLAIMS.items() if c.has_check and cid not in GPU_SUPPORT
               and not cid.endswith("e2e")]
    assert not missing, f"classify these claims in gpu/support.py (GPU_SUPPORT): {missing}"
    assert set(GPU_SUPPORT) <= set(CLAIMS), set(GPU_SUPPORT) - set(CLAIMS)


def test_rows_have_reasons_and_cpu_only_checks_ignore_backend():
    for cid, (ok, why) in GPU_SUPPORT.items():
        assert isinstance(ok, bool) and len(why) > 10
    assert gpu_support("MR.error")[0] and not gpu_support("SBW.kernel-identity")[0]
    assert gpu_support("UNKNOWN.claim") == (False, gpu_support("UNKNOWN.claim")[1])
    with pytest.raises(TypeError):
        gpu_support(3)
    lines = describe(["MR.error", "NORM.bounded"], "torch:cuda")
    assert lines[0].startswith("MR.error: on torch:cuda") and lines[1].startswith("NORM.bounded: on CPU")
