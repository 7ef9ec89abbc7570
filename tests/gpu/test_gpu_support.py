"""gpu_support: read off each claim's registry entry (``Claim.gpu``), each with a reason."""
import pytest

from kvbounds.gpu.support import describe, gpu_support
from kvbounds.claims import CLAIMS


def test_every_checked_claim_is_classified():
    missing = [cid for cid, c in CLAIMS.items() if c.has_check and c.gpu is None and not cid.endswith("e2e")]
    assert not missing, f"set gpu=(bool, why) in these claims' entries in kvbounds/claims/__init__.py: {missing}"


def test_rows_have_reasons_and_cpu_only_checks_ignore_backend():
    for cid, c in CLAIMS.items():
        if c.gpu is not None:
            ok, why = c.gpu
            assert isinstance(ok, bool) and len(why) > 10 and gpu_support(cid) == c.gpu
    assert gpu_support("MR.error")[0] and not gpu_support("SBW.kernel-identity")[0]
    assert gpu_support("UNKNOWN.claim") == (False, gpu_support("UNKNOWN.claim")[1])
    with pytest.raises(TypeError):
        gpu_support(3)
    lines = describe(["MR.error", "NORM.bounded"], "torch:cuda")
    assert lines[0].startswith("MR.error: on torch:cuda") and lines[1].startswith("NORM.bounded: on CPU")
