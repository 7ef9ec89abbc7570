"""Equal memory in the end-to-end harness (issue 21): every method holds within 1% of budget x exact floats,
never more than +1%; BalanceKV's layout; budgets no method can meet are refused."""
import math

import numpy as np
import pytest

from kvbounds.algorithms.kernel_thinning import goodpoints_missing
from kvbounds.algorithms.token_selection import memory_floats
from kvbounds.algorithms.validation import InputError
from kvbounds.e2e import _methods as M

BUDGETS = (0.2, 0.235375, 0.34475, 0.5, 0.75, 1.0)
HOST_METHODS = [m for m in M.OURS + M.CONTROLS if m not in M.NEEDS_INPUTS and m != "kernel_thinning"] + [
    pytest.param("kernel_thinning", marks=pytest.mark.skipif(goodpoints_missing() is not None,
                                                             reason=str(goodpoints_missing())))]


@pytest.fixture(scope="module")
def kv():
    rng = np.random.default_rng(0)
    H, n, d = 2, 640, 32
    return rng.standard_normal((H, n, d)).astype(np.float32), rng.standard_normal((H, n, d)).astype(np.float32)


@pytest.mark.parametrize("method", HOST_METHODS)
def test_every_method_holds_the_budget_within_one_percent(kv, method):
    K, V = kv
    H, n, d = K.shape
    for b in BUDGETS:
        assert M.budget_problem(n, d, 16, 16, b) is None
        floats = math.floor(b * n * 2 * d)
        c = M.compress_ours(method, K, V, floats, np.random.default_rng(1), sink=16, window=16)
        held = memory_floats(c) / H
        assert (1 - M.MEMORY_TOLERANCE) * floats <= held <= floats, (method, b, held / floats)


def test_balancekv_layout_fills_with_exact_recent_tokens():
    n, d, sink, window = 512, 64, 32, 32
    for b in (0.235375, 0.34475):        # the old budgets: T = 3 at both, 68% of the target at 0.34475
        floats = math.floor(b * n * 2 * d)
        for ptw in (0, 1):
            T, win = M.balance_layout(n, d, sink, window, floats, ptw)
            held = M.balance_floats(n, d, sink, win, T, ptw)
            assert win >= window and held <= floats and held >= floats - 2 * d - ptw - 1, (b, ptw, T, win)
            assert M.balance_floats(n, d, sink, win + 1, T, ptw) > floats


def test_balance_levels_refuses_no_middle_instead_of_hanging():
    for n in (64, 50):      # sink + window == n and > n (negative middle): used to loop forever
        with pytest.raises(InputError, match="no middle"):
            M.balance_levels(n, 64, 32, 32, 10**6)


def test_budget_problem_names_the_rule():
    assert M.budget_problem(512, 64, 32, 32, 0.25) is None
    assert "(0, 1]" in M.budget_problem(512, 64, 32, 32, 0.0)
    assert "(0, 1]" in M.budget_problem(512, 64, 32, 32, 1.5)
    assert "too small" in M.budget_problem(64, 64, 32, 32, 0.5)
    assert "sink" in M.budget_problem(512, 64, 32, 32, 0.1)
    assert "1%" in M.budget_problem(2048, 64, 4, 4, 0.04)
