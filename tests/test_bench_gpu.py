"""benchmarks/bench_gpu.py runs on CPU at reduced size and writes its JSON (every section, one repetition)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path, only):
    out = tmp_path / "b.json"
    assert _module().main(["--device", "cpu", "--quick", "--reps", "1", "--dtypes", "float32", "--only", only,
                           "--stream-budget", "5", "--out", str(out)]) == 0
    return json.loads(out.read_text())["results"]


def test_bench_gpu_quick_cpu(tmp_path):
    """The cheap sections in the default run; walk and fd (profiler, per-block loop) in the slow test below."""
    pytest.importorskip("torch")
    res = _run(tmp_path, "blockwise,bandwidth,streaming")
    bw = res["blockwise"]["dtypes"]["float32"]
    assert {"exact_sdpa", "released_walk", "batched_exact", "package_select"} <= set(bw["median_s"])
    assert isinstance(bw["speedup_target_met"], bool) and isinstance(bw["sdpa_target_met"], bool)
    assert res["bandwidth"]["peak_TBs"] is None and res["bandwidth"]["achieved_GBs"] > 0
    assert [r["n"] for r in res["streaming"]["streams"]["subgen"]["rows"]] == [64, 128, 256]


@pytest.mark.slow
def test_bench_gpu_quick_cpu_all_sections(tmp_path):
    pytest.importorskip("torch")
    res = _run(tmp_path, "walk,blockwise,bandwidth,streaming,fd")
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
