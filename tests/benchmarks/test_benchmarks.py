"""The benchmarks (issue 13) run: each bench_*.py --smoke (tiny sizes) writes JSON with its targets, each printed
as met / NOT met, its baselines measured in the same run, and (streaming) amortised per-token costs and accuracy
next to the all-zero estimator's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(name, tmp_path):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["targets"] and all(isinstance(t["met"], bool) for t in data["targets"])
    assert proc.stdout.count("TARGET") == len(data["targets"])
    assert all(("met" in line) for line in proc.stdout.splitlines() if "TARGET" in line)
    assert data["meta"]["load"]
    return data, proc.stdout


def test_bench_fd(tmp_path):
    data, _ = _run("bench_fd", tmp_path)
    fd = data["fd"]
    for k in ("standard", "ours_rows", "ours_blocks"):
        assert fd["accuracy"][k]["covariance_error"] <= fd["accuracy"][k]["certificate"] * (1 + 1e-9)
        assert fd["timing"][k]["time"]["median"] > 0
    assert fd["equal_accuracy"]
    assert {r["J"] for r in data["decode"]["rows"]} == {1, 32}
    for r in data["decode"]["rows"]:     # issue 26: the time model's terms and measured constants are recorded
        tm = r["time_model"]
        assert set(tm["terms"]["ours"]) == {"stream", "exp", "passes", "call"} and tm["ratio"] > 0
        assert r["model"] == tm["ratio"] and r["count_model"] > 0 and "measured" in tm["constants_are"]


def test_bench_balancekv(tmp_path):
    data, _ = _run("bench_balancekv", tmp_path)
    a = data["blockwise"]
    assert set(a["by_threads"]) == {"1", "2"}
    for nt, res in a["by_threads"].items():
        assert {"sdpa", "released", "ours", "ours_over_released"} <= set(res)
        assert res["baseline"] == "sdpa" and "rotating" in res["interleaving"]     # issue 26: stated in the JSON
        assert res["threads"]["torch"] == int(nt)
    prof = a["profile"]           # where the time goes: the parts add up to the total
    assert abs(sum(prof["seconds"].values()) - prof["total_s"]) <= 1e-9 + 1e-6 * prof["total_s"]
    assert set(prof["seconds"]) == {"gram_panels", "sign_loop", "walk_other", "halving", "prescale", "gathers", "rest"}
    assert prof["seconds"]["walk_other"] >= 0 and prof["seconds"]["gram_panels"] > 0    # each part timed, not a difference gone negative
    rows = data["streaming"]["rows"]
    assert [r["n"] for r in rows] == [256, 512] and all(r["mean_us_per_token"] > 0 for r in rows)
    acc = data["accuracy"]
    assert acc["zero_estimator_paper_units_median"] > 0 and acc["paper_units_median"] >= 0
    assert data["panel"]["same_signs"] and data["panel"]["panel"]["ratio"]["median"] > 0


def test_bench_subgen(tmp_path):
    data, _ = _run("bench_subgen", tmp_path)
    assert [r["n"] for r in data["speed"]["rows"]] == [256, 512]
    assert data["accuracy"]["zero_estimator_paper_units_median"] > 0
    m = data["meta"]                  # issue 26: baseline, interleaving and thread counts stated in the JSON
    assert "exact decode step" in m["baseline"] and "chunks of 256" in m["interleaving"]
    assert m["threads"] == 1 and m["thread_counts"]["pools"]


def test_released_walk_keeps_half_per_iteration():
    """The re-implemented released walk keeps n / 2^itrs distinct tokens per head."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_balancekv import released_balanced_walk
    g = torch.Generator().manual_seed(0)
    K, V = torch.randn(1, 2, 300, 8), torch.randn(1, 2, 300, 8)
    idx, w = released_balanced_walk(K, V, generator=g, itrs=2, block_size=32)
    assert idx.shape == (1, 2, 75) and w.shape == (1, 2, 75)
    for h in range(2):
        assert len(set(idx[0, h].tolist())) == 75 and int(idx.max()) < 300


@pytest.mark.slow
def test_bench_e2e_compression(tmp_path):
    """Issue 26's benchmark: every method's compress_all / the exact prefill, baseline and threads in the JSON."""
    pytest.importorskip("transformers")
    out = tmp_path / "e2e.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_e2e_compression.py"), "--n", "160",
                           "--reps", "1", "--threads", "1", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    if "skipped" in proc.stdout:
        pytest.skip(proc.stdout.strip())
    data = json.loads(out.read_text())
    run = data["runs"][0]
    assert run["threads"] == 1 and "prefill" in run["baseline"] and "rotating" in run["interleaving"]
    assert {r["method"] for r in run["rows"]} >= {"kcenter", "subgen", "balancekv"}
    assert data["targets"] and proc.stdout.count("TARGET") == len(data["targets"])
