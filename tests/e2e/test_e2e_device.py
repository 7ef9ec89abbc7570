"""The end-to-end harness's device path (issue 15): ``compress_all(where="device")`` hands our methods each layer's
K, V as float32 torch tensors on the model's device and keeps the compressed cache there. Checked on torch CPU,
on the smoke-size task of BKV.e2e (ppl, n = 256, sink = window = 32, the budget of BalanceKV with T = 1):

* every method of ours gives the host path's kept tokens (their keys, bit for bit; projections to float32
  rounding), log-weights and tail log-likelihoods, with the same seed; the k-center methods may differ only in a
  head where greedy k-center's farthest point is a tie to float32 rounding (different BLAS summation orders pick
  different points), which the test shows by replaying the traversal on both backends;
* no tensor is converted to numpy inside the device path, except the small host reads named in
  ``methods.DEVICE_HOST_COPIES`` (never a copy of K or V), and ``harness._to_layers`` moves nothing.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from kvbounds.algorithms.arrays import to_numpy

N, CONT, SINK = 256, 33, 32
KCENTER_BASED = ("kcenter", "kcenter_sized", "subgen")
# where a device-path method may read the host (functions of modules the harness does not own)
HOST_READ_SITES = {"panel_walk", "panel_walk_unchecked", "greedy_k_center", "recent_plus_centers", "memory_floats"}


@pytest.fixture(scope="module")
def cell(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import _methods as M
    task = tasks.ppl_task(lm, N, CONT, 0)
    state = harness.prefill(lm, task.context, capture_inputs=True)
    return lm, task, state, M.balance_budgets(N, SINK, (1,))[0]


def _compress(cell, method, where, seed=7):
    from kvbounds.e2e import _methods as M
    lm, _, state, budget = cell
    rng = np.random.default_rng([seed, 1])
    out = M.compress_all(method, lm, state, budget, rng, sink=SINK, window=SINK, seed=seed, where=where)
    return out, rng


@pytest.fixture(scope="module")
def device_runs():
    """method -> (compressed layers, the Generator after, Tensor.numpy / __array__ calls seen): the device path of
    each method run once per module and read by both tests below (they sit next to each other in the run order,
    conftest.pytest_collection_modifyitems, so one worker runs both)."""
    return {}


@contextlib.contextmanager
def _recording(seen: list):
    """Every Tensor.numpy / __array__ call appends (numel, the calling frames' function names) to ``seen``."""
    import sys

    import torch

    def recorder(orig):
        def f(self, *a, **k):
            frame, sites = sys._getframe(1), []
            while frame is not None and len(sites) < 8:
                sites.append(frame.f_code.co_name)
                frame = frame.f_back
            seen.append((int(self.numel()), sites))
            return orig(self, *a, **k)
        return f
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.Tensor, "numpy", recorder(torch.Tensor.numpy))
        m.setattr(torch.Tensor, "__array__", recorder(torch.Tensor.__array__))
        yield seen


def _device_run(cell, method, runs):
    """compress_all(where="device") of ``method`` with the conversions inside it recorded, once per module; a copy
    of the Generator after it each call."""
    import copy
    if method not in runs:
        with _recording([]) as seen:
            comp, rng = _compress(cell, method, "device")
        runs[method] = (comp, rng, seen)
    comp, rng, seen = runs[method]
    return comp, copy.deepcopy(rng), list(seen)


def _near_tie_divergence(K_np, k):
    """Greedy k-center of K (H, n, d) float32 on numpy and torch:cpu; per head, the first step where they pick
    different points and the relative gap between the two picks' distances to the centers before (float64)."""
    import torch
    from kvbounds.algorithms.kcenter import greedy_k_center
    cn = greedy_k_center(K_np, k).centers
    ct = to_numpy(greedy_k_center(torch.as_tensor(K_np), k).centers)
    gaps = {}
    for h in range(K_np.shape[0]):
        if np.array_equal(cn[h], ct[h]):
            continue
        j = int(np.argmax(cn[h] != ct[h]))
        X = K_np[h].astype(np.float64)
        md = ((X[:, None, :] - X[cn[h][:j]][None]) ** 2).sum(-1).min(1)
        a, b = md[cn[h][j]], md[ct[h][j]]
        gaps[h] = abs(a - b) / max(a, b)
    return gaps


def _centers(method, c, state_K, floats_d):
    """(the keys greedy k-center ran on, k) for a k-center-based method's layer."""
    n = state_K.shape[-2]
    if method == "subgen":                       # representatives: b finite, a = -inf
        reps = int(np.sum(np.isneginf(to_numpy(c.log_w_num[0])) & np.isfinite(to_numpy(c.log_w_den[0]))))
        return state_K[:, SINK:n - SINK], reps
    return state_K[:, :n - SINK], int(c.keys.shape[-2]) - SINK    # kcenter*: centers of all but the window


def _sizes_differ_at_ties(method, h, d, i, K):
    """Same centers, head i: False when the cluster-size weights agree; True when they differ only by points
    equidistant (to float32 rounding) from two centers, which the two backends may assign either way (asserted:
    the sizes' total agrees and their L1 difference is at most twice the number of such points)."""
    a_h, b_h, b_d = to_numpy(h.log_w_num[i]), to_numpy(h.log_w_den[i]), to_numpy(d.log_w_den[i])
    if np.array_equal(b_h, b_d):
        return False
    n = K.shape[-2]
    if method == "subgen":
        reps = np.isneginf(a_h) & np.isfinite(b_h)
        Km = K[i, SINK:n - SINK]
    else:
        reps = np.arange(b_h.shape[0]) < b_h.shape[0] - SINK
        Km = K[i, :n - SINK]
    np.testing.assert_array_equal(b_h[~reps], b_d[~reps])    # everything but the cluster sizes agrees
    C = to_numpy(h.keys[i])[reps].astype(np.float64)
    d2 = np.sort(((Km.astype(np.float64)[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
    ties = int(np.sum(d2[:, 1] - d2[:, 0] <= 1e-5 * d2[:, 1]))
    size_h, size_d = np.rint(np.exp(b_h[reps])), np.rint(np.exp(b_d[reps]))
    assert size_h.sum() == size_d.sum() == Km.shape[0]
    assert np.abs(size_h - size_d).sum() <= 2 * ties, (np.abs(size_h - size_d).sum(), ties)
    return True


@pytest.mark.parametrize("method", ["streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv",
                                    "balancekv_released", "subgen", "subspace"])
def test_device_path_matches_host_path(cell, method, device_runs):
    import torch
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _methods as M
    lm, task, state, _ = cell
    assert method in M.OURS and M.runs_on(method, "device") == "device" and method not in M.HOST_ONLY
    host, rng_h = _compress(cell, method, "host")
    dev, rng_d, _ = _device_run(cell, method, device_runs)
    assert rng_h.random() == rng_d.random()                  # the same draws were taken from the Generator
    tie_heads = []
    for l, (h, d) in enumerate(zip(host, dev)):
        for f in ("keys", "values", "log_w_num", "log_w_den"):
            a = getattr(d, f)
            assert isinstance(a, torch.Tensor) and a.device == torch.device(lm.device) and a.dtype == torch.float32, (l, f)
        assert (d.extra_floats, d.rank, d.projected) == (h.extra_floats, h.rank, h.projected)
        same_keys = [np.array_equal(to_numpy(d.keys[i]), h.keys[i]) for i in range(h.keys.shape[0])]
        if method in KCENTER_BASED and not all(same_keys):
            Km, k = _centers(method, h, state.keys[l][0].float().numpy(), None)
            gaps = _near_tie_divergence(Km, k)
            bad = [i for i, ok in enumerate(same_keys) if not ok]
            assert set(bad) <= set(gaps), (l, bad, gaps)     # a differing head is one whose traversal diverged ...
            assert all(gaps[i] < 1e-5 for i in bad), (l, gaps)   # ... at a tie to float32 rounding
            tie_heads += [(l, i) for i in bad]
        keep = [i for i, ok in enumerate(same_keys) if ok] if method in KCENTER_BASED else range(h.keys.shape[0])
        if method in ("kcenter_sized", "subgen"):
            sized = [i for i in keep if _sizes_differ_at_ties(method, h, d, i, state.keys[l][0].float().numpy())]
            tie_heads += [(l, i) for i in sized]
            keep = [i for i in keep if i not in sized]
        for i in keep:
            exact = method != "subspace"                     # a selection gathers the same float32 rows
            for f in ("keys", "values"):
                got, ref = to_numpy(getattr(d, f)[i]), getattr(h, f)[i]
                if exact:
                    np.testing.assert_array_equal(got, ref, err_msg=f"{method} layer {l} head {i} {f}")
                else:
                    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))
            for f in ("log_w_num", "log_w_den"):
                got, ref = to_numpy(getattr(d, f)[i]), getattr(h, f)[i]
                np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
                fin = np.isfinite(ref)
                np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-6, atol=1e-6)
    assert len(tie_heads) <= 0.1 * len(host) * host[0].keys.shape[0], tie_heads
    ll_h, _ = harness.score_tail(lm, state.n, harness._to_layers(lm, host), task.tail, task.targets)
    ll_d, _ = harness.score_tail(lm, state.n, harness._to_layers(lm, dev), task.tail, task.targets)
    assert np.isfinite(ll_d).all()
    print(f"{method}: {len(tie_heads)} of {len(host) * host[0].keys.shape[0]} heads differ at float32 ties")
    if not tie_heads:                                         # the same cache: the same likelihoods
        np.testing.assert_allclose(ll_d, ll_h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv",
                                    "balancekv_released", "subgen", "subspace", "kvpress:knorm"])
def test_device_path_converts_nothing_to_numpy(cell, method, device_runs):
    """Tensor.numpy / __array__ record every conversion inside compress_all(where="device") + _to_layers: none
    for a method not in DEVICE_HOST_COPIES; otherwise only at the named sites and never K- or V-sized."""
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _methods as M
    lm, _, state, _ = cell
    if method.startswith("kvpress:") and M.kvpress_available():
        pytest.skip(M.kvpress_available())
    comp, _, seen = _device_run(cell, method, device_runs)
    with _recording(seen):
        layers = harness._to_layers(lm, comp)
    # block_walk.host_view: zero-copy numpy views of CPU tensors for the walk's steps; a CUDA tensor never takes it
    seen = [(numel, sites) for numel, sites in seen if "host_view" not in sites]
    if method not in M.DEVICE_HOST_COPIES:
        assert not seen, seen[:3]
    H, n, d = state.keys[0].shape[1:]
    for numel, sites in seen:
        assert HOST_READ_SITES & set(sites), sites
        assert numel <= H * n < H * n * d, (numel, sites)       # at most one number per token and head
    for c, (k, v, a, b) in zip(comp, layers):                  # _to_layers moved nothing: the same storage
        assert k.data_ptr() == c.keys.data_ptr() and v.data_ptr() == c.values.data_ptr()
        assert a is None or a.data_ptr() == c.log_w_num.data_ptr()


def test_run_cell_device_rows_and_where(cell):
    from kvbounds.algorithms.validation import InputError
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _methods as M
    lm, task, state, budget = cell
    host = harness.run_cell(lm, task, ["uniform", "balancekv_released"], [budget], sink=SINK, window=SINK,
                            state=state)
    dev = harness.run_cell(lm, task, ["uniform", "balancekv_released"], [budget], sink=SINK, window=SINK,
                           state=state, where="device")
    for h, d in zip(host, dev):
        assert not d["error"], d
        assert d["memory_floats"] == h["memory_floats"]
        np.testing.assert_allclose(d["ll"], h["ll"], rtol=1e-5, atol=1e-5)
    assert M.path_note("uniform", "device").startswith("device:") and M.path_note("uniform").startswith("host:")
    with pytest.raises(InputError):
        M.runs_on("uniform", "gpu")
