"""benchmarks/bench_gpu.py runs on CPU at reduced size and writes its JSON (every section, one repetition)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, only, *extra):
    """One run of bench_gpu.main. The streams' time budget is out of reach (10^6 s): the rows asked for do not
    depend on the machine's load (the budget's stop is tested on its own below)."""
    out = tmp_path / "b.json"
    assert _module().main(["--device", "cpu", "--quick", "--reps", "1", "--dtypes", "float32", "--only", only,
                           "--stream-budget", "1e6", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_bench_gpu_quick_cpu(tmp_path):
    """The cheap sections in the default run; walk and fd (profiler, per-block loop) in the slow test below."""
    pytest.importorskip("torch")
    data = _run(tmp_path, "blockwise,bandwidth,streaming")
    res = data["results"]
    assert data["meta"]["warmup"] == 1 and data["meta"]["reps"] == 1
    bw = res["blockwise"]["dtypes"]["float32"]
    assert {"exact_sdpa", "released_walk", "batched_exact", "package_select"} <= set(bw["median_s"])
    assert isinstance(bw["speedup_target_met"], bool) and isinstance(bw["sdpa_target_met"], bool)
    assert res["bandwidth"]["peak_TBs"] is None and res["bandwidth"]["achieved_GBs"] > 0
    assert [r["n"] for r in res["streaming"]["streams"]["subgen"]["rows"]] == [64, 128, 256]


def test_streams_stop_at_the_first_checkpoint_past_the_time_budget():
    pytest.importorskip("torch")
    res = _module().bench_streaming(True, "cpu", 0.0)
    for name in ("subgen", "balancekv"):
        s = res["streams"][name]
        assert [r["n"] for r in s["rows"]] == [64], name
        assert s["note"] == "stopped after n = 64: n = 128 would exceed the 0 s budget"


@pytest.mark.slow
def test_bench_gpu_quick_cpu_all_sections(tmp_path):
    pytest.importorskip("torch")
    res = _run(tmp_path, "walk,blockwise,bandwidth,streaming,fd")["results"]
    assert set(res) == {"walk", "blockwise", "bandwidth", "streaming", "fd"}
    assert all(res["walk"]["signs_equal_reference"].values())
    assert 4.5 <= res["walk"]["ops_per_step"]["exact"]["per_step"] <= 6.5
    assert res["fd"]["fd_rows_per_s"] > 0


def test_released_walk_halves_and_keeps_distinct_tokens():
    torch = pytest.importorskip("torch")
    mod = _module()
    g = torch.Generator().manual_seed(0)
    K, V = torch.randn(1, 2, 200, 8, generator=g), torch.randn(1, 2, 200, 8, generator=g)
    idx, w = mod.released_balanced_walk(K, V, torch.Generator().manual_seed(1), gamma=0.01, itrs=2, block_size=32)
    assert idx.shape == (1, 2, 50) and w.shape == (1, 2, 50)
    for h in range(2):
        assert len(set(idx[0, h].tolist())) == 50 and int(idx.max()) < 200


def test_bench_gpu_e2e_quick_cpu(tmp_path):
    """The e2e section at n = 128 on CPU, one repetition and no warm-up (the test checks the rows, not the times):
    every method timed on the host path and the device path against the exact prefill of the same run (or a row with
    its reason), equal memory, each row saying where it ran; the two paths agree on the next token's log-likelihood
    (the k-center methods up to float32 ties, see test_e2e_device.py); baseline, interleaving and threads stated."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kvbounds.e2e._checks import hf_missing
    if hf_missing():
        pytest.skip(hf_missing())
    e2e = _run(tmp_path, "e2e", "--e2e-n", "128", "--warmup", "0")["results"]["e2e"]
    assert e2e["baseline"] == "prefill" and e2e["interleaving"].startswith("1 repetitions after 0 warm-up(s)")
    assert e2e["torch_threads"] == 1 and e2e["threads"]["torch"] == 1
    assert e2e["n"] == 128 and e2e["prefill_s"] > 0 and e2e["decode_exact_s"] > 0
    rows = {(r["method"], r["path"]): r for r in e2e["rows"]}
    ours = {"balancekv", "balancekv_released", "uniform", "subgen", "subspace", "streaming_llm", "kcenter"}
    assert {(m, p) for m in ours for p in ("host", "device")} <= set(rows)
    for (m, p), r in rows.items():
        if m.startswith("kvpress:"):
            assert r["where"].startswith("runs on cpu: torch press on the device")
            if r["error"]:
                assert r["error"].startswith("skipped: kvpress not installed")
                continue
        elif p == "host":
            assert r["where"].startswith("runs on CPU: host: numpy") and r["runs_on"] == "host"
        else:
            assert r["where"].startswith("runs on cpu: device: torch") and r["runs_on"] == "device"
        assert not r["error"], r
        assert r["ratio_to_prefill"] > 0 and r["prefill_plus_compress_ratio"] == pytest.approx(1 + r["ratio_to_prefill"])
        assert r["memory_fraction"] <= e2e["budget"] + 1e-9 and math.isfinite(r["next_token_ll"])
        if p == "host":
            assert r["decode_ratio_to_exact"] > 0
        else:
            assert r["speedup_vs_host"] > 0
            if m not in ("kcenter", "kcenter_sized", "subgen"):
                assert r["ll_diff_vs_host"] < 1e-4, r
