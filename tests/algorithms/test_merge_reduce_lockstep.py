"""MergeAndReduce run R times in lockstep (algorithms.merge_reduce_lockstep; MR.error's scale sweep, issue 47): each
run is MergeAndReduce with its own Generator, step for step, and the error over every step is its largest at the
steps j = t, 2t, ..."""
import math

import numpy as np
import pytest

from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.merge_reduce_lockstep import masked_walk, merge_and_reduce_lockstep
from kvbounds.algorithms.softmax_balance import softmax_balance
from kvbounds.algorithms.validation import InputError
from kvbounds.proofs_checks.mr_error import exact_numerator_log, lockstep_eps
from kvbounds.theory.balancekv import merge_reduce_eps_implied


def _stream(n, d=2, s=1, seed=0):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((n, d))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    return K, rng.standard_normal((n, s))


@pytest.mark.parametrize("signs,t,T,s", [("walk", 40, 2, 1), ("random", 40, 2, 1), ("walk", 600, 2, 1),
                                          ("walk", 32, 3, 2)])
def test_each_run_is_merge_and_reduce_with_its_generator(signs, t, T, s):
    """The cells of run r after every batch equal MergeAndReduce's with the same Generator (t = 600: the panel walk
    of t > 512; s = 2: a value product of several columns)."""
    n = 4 * t if T == 2 else 8 * t
    K, V = _stream(n, s=s)
    seeds = (5, 6, 7)
    levels = merge_and_reduce_lockstep(K, V, t=t, T=T, delta=0.01, rngs=[np.random.default_rng(x) for x in seeds],
                                       r_key=1.0, signs=signs)
    assert sorted(levels) == [k * t for k in range(1, n // t + 1)]
    for run, seed in enumerate(seeds):
        mr = MergeAndReduce(2, s, t=t, T=T, delta=0.01, rng=np.random.default_rng(seed), r_key=1.0, signs=signs)
        for j in range(n):
            mr._push(K[j], V[j])
            if (j + 1) % t:
                continue
            L = levels[j + 1][run]
            for i, (ck, _) in enumerate(mr.cells()):
                got = K[:j + 1][L == i]
                assert (ck is None and len(got) == 0) or np.array_equal(np.asarray(ck), got)


def test_masked_walk_is_softmax_balance_on_each_runs_members():
    K, V = _stream(300, s=1, seed=3)
    rng = np.random.default_rng(1)
    member = rng.random((3, 300)) < 0.6
    U = rng.random((3, 300))
    c = np.array([50.0, 80.0, 3.0])
    rv = np.array([np.abs(V[m]).max() for m in member])
    eta = masked_walk(K, V, member, U, c, r_key=1.0, r_value=rv, scale=1 / math.sqrt(2), panel=16, chunk=40)
    for r in range(3):
        ref = softmax_balance(K[member[r]], V[member[r]], delta=0.01, rng=None, r_key=1.0, c=float(c[r]),
                              on_fail="continue", uniforms=U[r, member[r]].copy())
        np.testing.assert_array_equal(eta[r, member[r]], np.asarray(ref.signs))
        assert not eta[r, ~member[r]].any()


def test_lockstep_eps_is_the_largest_error_over_every_step():
    """For a fixed query the error changes only at j = t, 2t, ...: the largest over every step j equals the largest
    over those, computed from the cells as MergeAndReduce's estimate would."""
    t, n = 30, 120
    K, V = _stream(n, seed=4)
    Qs = _stream(3, seed=9)[0]
    levels = merge_and_reduce_lockstep(K, V, t=t, T=2, delta=0.01, rngs=[np.random.default_rng(2)], r_key=1.0)
    got = lockstep_eps(K, V, Qs, levels)[0]
    mr = MergeAndReduce(2, 1, t=t, T=2, delta=0.01, rng=np.random.default_rng(2), r_key=1.0)
    want = np.zeros(3)
    for j in range(1, n + 1):
        mr._push(K[j - 1], V[j - 1])
        for m, q in enumerate(Qs):
            m_z, u_z = mr.estimate(q)
            m_x, u_x = exact_numerator_log(K, V, q, j)
            err = float(np.linalg.norm(np.exp(m_z - m_x) * u_z - u_x)) * math.exp(m_x)
            want[m] = max(want[m], merge_reduce_eps_implied(err, j, 1.0, 2, float(np.abs(V[:j]).max())))
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_bad_arguments_are_refused_by_name():
    K, V = _stream(64)
    for kw, word in ((dict(t=7), "t"), (dict(T=0), "T"), (dict(signs="coin"), "signs")):
        args = dict(t=16, T=2, delta=0.01, rngs=[np.random.default_rng(0)], r_key=1.0) | kw
        with pytest.raises(InputError, match=word):
            merge_and_reduce_lockstep(K, V, **args)
