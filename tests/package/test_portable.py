"""`make test-portable` reruns the float-sensitive tests with other kernels: this test, float-sensitive itself, fails
when the settings the target asks for (one thread, torch's CPU capability forced down) are not in effect."""
from __future__ import annotations

import os
import platform

import pytest

pytestmark = pytest.mark.float_sensitive


@pytest.mark.skipif(os.environ.get("KVBOUNDS_TEST_PORTABLE") != "1",
                    reason="checks `make test-portable`'s settings (it sets KVBOUNDS_TEST_PORTABLE=1); in another run "
                           "a test may have raised a pool's threads")
def test_forced_kernels_are_in_effect():
    torch = pytest.importorskip("torch")
    from threadpoolctl import threadpool_info
    cap = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    got = torch.backends.cpu.get_cpu_capability().lower()
    if cap == "default":
        assert got == "default", got
    elif cap == "avx2" and platform.machine().lower() in ("x86_64", "amd64"):
        assert got in ("avx2", "default"), got          # the CPU may lack AVX2: torch then runs no SIMD
    if os.environ.get("OMP_NUM_THREADS") == "1":
        assert torch.get_num_threads() == 1
        assert all(p["num_threads"] == 1 for p in threadpool_info()), threadpool_info()
