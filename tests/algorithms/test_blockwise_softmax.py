"""The one-pass blockwise softmax (004 Sec. 6; claim SUB.blockwise) as hypothesis properties: agreement with the
softmax over the concatenation (and a high-precision reference), invariance to how tokens are chunked, stability
under extreme logits, masks, empty and fully masked chunks; the draft's literal pseudocode fails where ours does not."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbounds.algorithms.blockwise_softmax import OnlineSoftmax, blockwise_softmax, blockwise_softmax_literal, softmax_concat
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.proofs_checks.sub_blockwise import mp_reference

EPS = np.finfo(float).eps


@st.composite
def chunked(draw, with_basis=True):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    J = draw(st.integers(1, 6))
    sizes = draw(st.lists(st.integers(0, 7), min_size=J, max_size=J))
    if sum(sizes) == 0:
        sizes[-1] = 1
    scale = 10.0 ** draw(st.sampled_from([0, 1, 2, 3, 100, 300]))
    mask_mode = draw(st.sampled_from(["none", "random", "leading", "inf"]))
    r_v, d = 3, 5
    chunks = []
    for j, L in enumerate(sizes):
        l = np.clip(rng.standard_normal(L) * scale, -1.7e308, 1.7e308)
        mask = np.ones(L, bool)
        if mask_mode == "random":
            mask = rng.random(L) < 0.6
        elif mask_mode == "leading" and j < J // 2 + 1 and j < J - 1:
            mask[:] = False
        elif mask_mode == "inf":
            l = np.where(rng.random(L) < 0.3, -np.inf, l)
        D = rng.standard_normal((L, r_v))
        E = np.linalg.qr(rng.standard_normal((d, r_v)))[0].T if with_basis else None
        chunks.append([l, D, E, mask])
    visible = [(c, i) for c in chunks for i in range(len(c[0])) if c[3][i] and np.isfinite(c[0][i])]
    if not visible:
        c = next(c for c in reversed(chunks) if len(c[0]))
        c[3][-1], c[0][-1] = True, 0.0
    if not with_basis:
        chunks = [[l, D, None, m] for l, D, _, m in chunks]
    return chunks


def _vmax(chunks):
    return max(float(np.abs(c[1] @ c[2] if c[2] is not None else c[1]).max()) for c in chunks if len(c[0]))


@given(chunked())
def test_equals_softmax_over_the_concatenation(chunks):
    ours = blockwise_softmax([tuple(c) for c in chunks])
    ref = mp_reference([(l, D, E, m) for l, D, E, m in chunks])
    n = sum(len(c[0]) for c in chunks)
    assert np.all(np.isfinite(ours))
    assert np.abs(ours - ref).max() <= 16 * EPS * (n + len(chunks) + 5) * _vmax(chunks)
    np.testing.assert_allclose(softmax_concat([tuple(c) for c in chunks]), ours, atol=1e-13 * _vmax(chunks))


@given(chunked(with_basis=False), st.integers(0, 2**31 - 1))
def test_invariant_to_chunking(chunks, seed):
    """Concatenate every chunk's tokens and split them again at random points: the result does not change."""
    l = np.concatenate([np.where(c[3], c[0], -np.inf) for c in chunks])
    V = np.concatenate([c[1] for c in chunks])
    cuts = sorted(np.random.default_rng(seed).integers(0, len(l) + 1, 3))
    pieces = np.split(np.arange(len(l)), cuts)
    out = blockwise_softmax([(l[p], V[p]) for p in pieces])
    np.testing.assert_allclose(out, blockwise_softmax([(l, V)]), atol=1e-13 * _vmax(chunks))


def test_draft_literal_nan_on_a_masked_leading_chunk():
    chunks = [(np.array([-np.inf]), np.ones((1, 1)), np.ones((1, 1))), (np.array([0.0]), 2 * np.ones((1, 1)), np.ones((1, 1)))]
    assert np.isnan(blockwise_softmax_literal(chunks)).all()
    np.testing.assert_allclose(blockwise_softmax(chunks), [2.0])
    with pytest.raises(ValueError):                   # the literal version cannot take an empty chunk
        blockwise_softmax_literal([(np.zeros(0), np.zeros((0, 1)))] + [c[:2] for c in chunks])
    np.testing.assert_allclose(blockwise_softmax([(np.zeros(0), np.zeros((0, 1)))] + [c[:2] for c in chunks]), [2.0])


def test_extreme_logits_and_batched_queries():
    l = np.array([[1.7e308, -1.7e308, 1.0], [-1e300, -1e300, -1e300]])
    V = np.eye(3)
    out = blockwise_softmax([(l[:, :1], V[:1]), (l[:, 1:], V[1:])])
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-15)


def test_matches_across_backends(backend):
    rng = np.random.default_rng(4)
    chunks = [(rng.standard_normal(L) * 30, rng.standard_normal((L, 3)), np.linalg.qr(rng.standard_normal((6, 3)))[0].T)
              for L in (4, 0, 9, 2)]
    ref = blockwise_softmax(chunks)
    got = blockwise_softmax([tuple(asarray(x, backend) for x in c) for c in chunks])
    np.testing.assert_allclose(to_numpy(got), ref, atol=1e-14)


@pytest.mark.parametrize("case", ["all_masked", "no_chunks", "nan", "plus_inf", "len_mismatch", "basis_mismatch",
                                  "batch_mismatch", "int_logits"])
def test_bad_input_raises(case):
    V = np.ones((2, 3))
    calls = {
        "all_masked": lambda: blockwise_softmax([(np.full(2, -np.inf), V), (np.zeros(2), V, None, np.zeros(2, bool))]),
        "no_chunks": lambda: blockwise_softmax([]),
        "nan": lambda: blockwise_softmax([(np.array([0.0, np.nan]), V)]),
        "plus_inf": lambda: blockwise_softmax([(np.array([0.0, np.inf]), V)]),
        "len_mismatch": lambda: blockwise_softmax([(np.zeros(3), V)]),
        "basis_mismatch": lambda: blockwise_softmax([(np.zeros(2), V, np.ones((2, 4)))]),
        "batch_mismatch": lambda: OnlineSoftmax().add(np.zeros((2, 2)), V).add(np.zeros((3, 2)), V),
        "int_logits": lambda: blockwise_softmax([(np.zeros(2, dtype=np.int64), V)]),
    }
    with pytest.raises(InputError):
        calls[case]()


def test_fully_masked_chunks_anywhere_are_skipped_exactly():
    rng = np.random.default_rng(9)
    l, V = rng.standard_normal(6), rng.standard_normal((6, 2))
    keep = np.array([0, 0, 1, 1, 0, 1], bool)
    out = blockwise_softmax([(l[:2], V[:2], None, keep[:2]), (l[2:4], V[2:4]), (l[4:5], V[4:5], None, keep[4:5]),
                             (l[5:], V[5:])])
    w = np.exp(l[keep] - l[keep].max())
    np.testing.assert_allclose(out, (w / w.sum()) @ V[keep], atol=1e-15)
    assert not math.isnan(float(out[0]))


def test_chunks_from_another_backend_or_device(backend):
    pytest.importorskip("torch")
    from backend_helpers import host_tensor_after
    from kvbounds.algorithms.blockwise_softmax import OnlineSoftmax
    acc = OnlineSoftmax().add(asarray(np.zeros(3), backend), asarray(np.ones((3, 2)), backend))
    host_tensor_after(backend, lambda host: acc.add(host(np.zeros(2)), host(np.ones((2, 2)))))
