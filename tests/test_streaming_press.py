"""The streaming presses (issue 23; claims BKV.decode, SG.decode): every layer stays at target + interval tokens
while a model reads and generates, the weights keep the mass of the tokens they stand for, the BalanceKV
certificate covers the error against exact attention over the layer's whole history, and bad input is refused
before generation. Cheap tests on a tiny random Llama; the issue's SmolLM2 run (512 + 1024 tokens) is slow."""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("kvpress", reason="kvpress not installed (pip install 'kvbounds[kvpress]'): press tests skipped")

from kvbounds.algorithms.validation import InputError  # noqa: E402
from kvbounds.e2e.weighted_cache import ModelNotWeighted  # noqa: E402
from kvbounds.streaming import StreamingBalanceKVPress, StreamingSubGenPress, generate, weighted_output  # noqa: E402

PRESSES = (StreamingBalanceKVPress, StreamingSubGenPress)


def tiny_model(weighted: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM
    from kvbounds.e2e.attention import use_weighted_attention
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    m = LlamaForCausalLM(cfg).eval()
    if weighted:
        use_weighted_attention(m)
    return m


class Sizes:
    """Observer: the stored size of every layer at every attention call, and the layers' full history."""

    def __init__(self):
        self.sizes, self.hist = [], {}

    def __call__(self, press, module, kwargs, layer):
        L = kwargs["hidden_states"].shape[1]
        self.sizes.append(int(layer.keys.shape[-2]))
        k, v = self.hist.get(module.layer_idx, (None, None))
        nk, nv = layer.keys[:, :, -L:].double(), layer.values[:, :, -L:].double()
        self.hist[module.layer_idx] = (nk, nv) if k is None else (torch.cat([k, nk], 2), torch.cat([v, nv], 2))


@pytest.mark.parametrize("cls", PRESSES)
def test_every_layer_stays_at_target_plus_interval(cls):
    model, obs = tiny_model(), Sizes()
    press = cls(target=48, interval=16, sink=4, window=8, observer=obs)
    ids = torch.randint(0, 100, (1, 70))
    out = generate(model, press, ids, 60)
    assert out.shape == (1, 130)
    assert max(obs.sizes) <= 48 + 16 and press.peak == max(obs.sizes) and press.reductions >= 5
    # the logical length is every token seen; the stored one is the target plus the tokens since the last reduction
    with torch.no_grad(), press(model):
        from transformers import DynamicCache
        cache = DynamicCache()
        for i in range(0, 129, 16):
            model(input_ids=out[:, i:min(i + 16, 129)], past_key_values=cache)
        assert all(l.get_seq_length() == 129 for l in cache.layers)
        assert all(48 <= l.keys.shape[-2] <= 64 for l in cache.layers)


def test_weights_keep_the_mass():
    """BalanceKV: the middle's weights e^a sum to the tokens it stands for (pairs keep exactly half at twice the
    weight); SubGen: the denominator's weights sum to the tokens absorbed (counts n_i over t samples each)."""
    model = tiny_model()
    for cls in PRESSES:
        press = cls(target=48, interval=16, sink=4, window=8)
        from transformers import DynamicCache
        cache = DynamicCache()
        ids = torch.randint(0, 100, (1, 200))
        with torch.no_grad(), press(model):
            for i in range(0, 200, 16):
                model(input_ids=ids[:, i:i + 16], past_key_values=cache)
        for layer in cache.layers:
            n, stored = layer.get_seq_length(), layer.keys.shape[-2]
            recent = stored - 4 - press._mid
            den = torch.exp(layer.log_w_den.double()).sum(-1)
            assert torch.allclose(den, torch.full_like(den, float(n)), rtol=1e-6), (cls.__name__, den, n)
            assert recent >= 8


def test_balancekv_certificate_covers_the_error():
    model, obs = tiny_model(), Sizes()
    press = StreamingBalanceKVPress(target=40, interval=8, sink=2, window=4, observer=obs)
    covered = []

    def check(p, module, kwargs, layer):
        obs(p, module, kwargs, layer)
        if p.reductions == 0 or kwargs["hidden_states"].shape[1] != 1:
            return
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        hid = kwargs["hidden_states"]
        q = module.q_proj(hid).view(1, 1, -1, module.head_dim).transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q = apply_rotary_pos_emb(q, q, cos, sin)[0][:, :, -1]
        K, V = obs.hist[module.layer_idx]
        Kq = K.repeat_interleave(2, 1)
        Vq = V.repeat_interleave(2, 1)
        w = torch.softmax(torch.einsum("bhd,bhnd->bhn", q.double(), Kq) * module.scaling, -1)
        exact = torch.einsum("bhn,bhne->bhe", w, Vq)
        est, _, _ = weighted_output(layer, q, module.scaling)
        err = (est - exact).norm(dim=-1)
        cert = p.certificate(module.layer_idx, layer, q, module.scaling)
        covered.append(bool((err <= cert * (1 + 1e-6) + 1e-9).all()))

    press.observer = check
    generate(model, press, torch.randint(0, 100, (1, 40)), 40)
    assert covered and all(covered)


@pytest.mark.parametrize("kw, rule", [(dict(target=30, sink=8, window=8), "target must be >= sink + window"),
                                      (dict(interval=0), "interval must be >= 1"),
                                      (dict(sink=-1), "sink must be a non-negative integer"),
                                      (dict(seed=1.5), "seed must be a non-negative integer")])
@pytest.mark.parametrize("cls", PRESSES)
def test_bad_parameters(cls, kw, rule):
    with pytest.raises(InputError, match=re.escape(rule)):
        cls(**kw)


def test_bad_model_and_hidden_states_raise_before_generation():
    from transformers import DynamicCache
    plain = tiny_model(weighted=False)
    cache = DynamicCache()
    with pytest.raises(ModelNotWeighted):
        with StreamingBalanceKVPress(target=48, interval=16, sink=4, window=8)(plain):
            plain(input_ids=torch.randint(0, 100, (1, 8)), past_key_values=cache)
    assert cache.get_seq_length() == 0                   # nothing written
    model = tiny_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[5] = math.nan
    for cls in PRESSES:
        with pytest.raises(InputError, match="NaN"):
            generate(model, cls(target=48, interval=16, sink=4, window=8), torch.full((1, 8), 5), 4)
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(model, StreamingSubGenPress(target=48, interval=16, sink=4, window=8), torch.ones(1, 4).long(), -1)


@pytest.mark.slow
@pytest.mark.parametrize("cls", PRESSES)
def test_smollm2_512_plus_1024_stays_under_320(cls):
    """The issue's done-when: 1024 tokens after a 512-token prompt, target 256, interval 64: every layer <= 320."""
    from kvbounds.e2e.model import load_model
    from kvbounds.traces.real import default_text
    lm = load_model()
    ids = torch.as_tensor(lm.encode(default_text())[:512][None]).long()
    obs = Sizes()
    press = cls(target=256, interval=64, observer=lambda p, m, kw, layer: obs.sizes.append(layer.keys.shape[-2]))
    out = generate(lm.model, press, ids, 1024)
    assert out.shape == (1, 1536) and max(obs.sizes) <= 320 and press.reductions >= 20


@pytest.mark.parametrize("cls", PRESSES)
def test_inside_model_generate(cls):
    """``with press(model): model.generate(...)``: the prompt is held whole during its own forward pass, then every
    layer stays at target + interval while decoding."""
    model, obs = tiny_model(), Sizes()
    press = cls(target=48, interval=16, sink=4, window=8, observer=obs)
    ids = torch.randint(0, 100, (1, 90))
    with torch.no_grad(), press(model):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=50, do_sample=False,
                             pad_token_id=0)
    assert out.shape == (1, 140)
    assert obs.sizes[:2] == [90, 90] and max(obs.sizes[2:]) <= 64 and press.reductions >= 3


@pytest.mark.slow
def test_bench_streaming_decode_smoke(tmp_path):
    """benchmarks/bench_streaming_decode.py --smoke (a subprocess importing transformers and kvpress: ~20-70 s)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_streaming_decode.py"), "--smoke",
                           "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["n"] for r in data["rows"]] == [256, 512] and len(data["targets"]) == 4
    assert proc.stdout.count("TARGET") == 4
    for r in data["rows"]:
        assert r["floats_held"]["exact"] > r["floats_held"]["streaming_balancekv"] > 0
