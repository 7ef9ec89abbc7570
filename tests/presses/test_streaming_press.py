"""The streaming presses (claims BKV.decode, SG.decode): every layer stays at target + interval tokens while a model
reads and generates, the weights keep the mass of the tokens they stand for, the BalanceKV bound covers the error
against exact attention over the layer's whole history, the error bar comes in one call saying what it is,
generate honours the attention mask, and bad input is refused before generation. They need transformers, not
kvpress. Cheap tests on a tiny random Llama; the SmolLM2 run (512 + 1024 tokens) is slow. The invariants over
every option are properties in tests/presses/test_streaming_invariants.py."""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvbounds.algorithms.validation import InputError  # noqa: E402
from kvbounds.e2e import ModelNotWeighted  # noqa: E402
from kvbounds.presses._streaming import StreamingBalanceKVPress, StreamingSubGenPress, weighted_output
from kvbounds.presses._streaming import generate  # noqa: E402

from tiny_models import ARCHS, tiny_causal_lm  # noqa: E402

PRESSES = (StreamingBalanceKVPress, StreamingSubGenPress)


ARCH = {"now": "llama"}      # the architecture tiny_model() builds; the fixture runs each model test on both


@pytest.fixture(params=ARCHS)
def arch(request):
    """Llama (SmolLM2's) and Qwen2 (Qwen2.5-Coder-0.5B's: q/k/v biases, untied output): the same tests on both."""
    ARCH["now"] = request.param
    yield request.param
    ARCH["now"] = "llama"


def tiny_model(weighted: bool = True):
    from kvbounds.e2e import use_weighted_attention
    torch.manual_seed(0)
    m = tiny_causal_lm(ARCH["now"], vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
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
def test_every_layer_stays_at_target_plus_interval(cls, arch):
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


def test_weights_keep_the_mass(arch):
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


def test_balancekv_certificate_covers_the_error(arch):
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
        cert = p.certificate(module.layer_idx, layer, q, module.scaling).value
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


def test_bad_model_and_hidden_states_raise_before_generation(arch):
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
    from kvbounds.e2e import load_model
    from kvbounds.traces.real import default_text
    lm = load_model()
    ids = torch.as_tensor(lm.encode(default_text())[:512][None]).long()
    obs = Sizes()
    press = cls(target=256, interval=64, observer=lambda p, m, kw, layer: obs.sizes.append(layer.keys.shape[-2]))
    out = generate(lm.model, press, ids, 1024)
    assert out.shape == (1, 1536) and max(obs.sizes) <= 320 and press.reductions >= 20


@pytest.mark.parametrize("cls", PRESSES)
def test_inside_model_generate(cls, arch):
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
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_streaming_decode.py"), "--smoke",
                           "--out", str(out)], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["n"] for r in data["rows"]] == [256, 512] and len(data["targets"]) == 4
    assert proc.stdout.count("TARGET") == 4
    for r in data["rows"]:
        assert r["floats_held"]["exact"] > r["floats_held"]["streaming_balancekv"] > 0


@pytest.mark.parametrize("cls", PRESSES)
def test_generate_honours_the_attention_mask(cls, arch):
    """Left- and right-padded rows give the tokens each row gives alone (each row runs from its own tokens, rows of
    equal length together, each row with its own random stream)."""
    model = tiny_model()
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(0, 100, (n,), generator=g) for n in (70, 61, 65, 61)]
    ids = torch.zeros(4, 70, dtype=torch.long)
    mask = torch.zeros(4, 70, dtype=torch.long)
    ids[0], mask[0] = rows[0], 1
    ids[1, 9:], mask[1, 9:] = rows[1], 1                 # left padding
    ids[2, :65], mask[2, :65] = rows[2], 1               # right padding
    ids[3, 9:], mask[3, 9:] = rows[3], 1                 # left padding, the same length as row 1
    kw = dict(target=48, interval=16, sink=4, window=8, seed=2)
    out = generate(model, cls(**kw), ids, 20, attention_mask=mask)
    assert out.shape == (4, 90) and torch.equal(out[:, :70], ids)
    for r, row in enumerate(rows):
        alone = generate(model, cls(**kw), row[None], 20)
        assert torch.equal(out[r, 70:], alone[0, len(row):]), r


@pytest.mark.parametrize("kw, rule", [
    (dict(chunk=17), "at most the press's interval"), (dict(chunk=0), "chunk must be an integer >= 1"),
    (dict(max_new_tokens=2000), "exceed the model's context"), (dict(max_new_tokens=1.5), "max_new_tokens"),
    (dict(attention_mask=torch.ones(1, 7)), "of input_ids' shape"),
    (dict(attention_mask=torch.tensor([[1, 0, 1, 1, 1, 1, 1, 1]])), "not one block"),
    (dict(attention_mask=torch.zeros(1, 8, dtype=torch.long)), "has no token"),
    (dict(attention_mask=torch.full((1, 8), 2)), "hold 0 (padding) and 1"),
    (dict(input_ids=torch.full((1, 8), 100)), "vocabulary"), (dict(input_ids=torch.ones(1, 8)), "torch.long"),
    (dict(press="bkv"), "press must be a streaming press")])
def test_bad_generate_arguments(kw, rule, arch):
    model = tiny_model()
    args = dict(press=StreamingBalanceKVPress(target=48, interval=16, sink=4, window=8),
                input_ids=torch.ones(1, 8, dtype=torch.long), max_new_tokens=4)
    args.update(kw)
    with pytest.raises(InputError, match=re.escape(rule)):
        generate(model, args.pop("press"), args.pop("input_ids"), args.pop("max_new_tokens"), **args)


@pytest.mark.parametrize("kw, rule", [(dict(seed=2 ** 63), "less than 2^63"), (dict(per_cluster=-1), "per_cluster"),
                                      (dict(per_cluster=2.0), "per_cluster"), (dict(clusters=0), "clusters"),
                                      (dict(clusters=40), "clusters = 40 must be less than the middle"),
                                      (dict(observer=3), "observer must be callable")])
def test_bad_subgen_options(kw, rule):
    with pytest.raises(InputError, match=re.escape(rule)):
        StreamingSubGenPress(target=48, interval=16, sink=4, window=8, **kw)


@pytest.mark.parametrize("cls", PRESSES)
def test_error_bar_in_one_call_says_what_it_is(cls, arch):
    """``press.error_bar()``: one ErrorBar per layer at the last query, its kind stated, a valid bound never above
    the trivial bar ||o_hat|| + max||v||, vacuous heads flagged with the reason; bad arguments refused by name."""
    model = tiny_model()
    press = cls(target=48, interval=16, sink=4, window=8)
    with pytest.raises(InputError, match="no query yet"):
        press.error_bar()
    generate(model, press, torch.randint(0, 100, (1, 70), generator=torch.Generator().manual_seed(1)), 30)
    bars = press.error_bar()
    assert len(bars) == 2 and all(b.kind == press.certificate_kind for b in bars)
    for kind in ("bound", "estimate"):
        bar = press.error_bar(1, kind=kind)
        assert bar.kind == kind and bar.value.shape == (1, 4) and bool(torch.isfinite(bar.log_value).all())
        assert kind in bar.reason or ("an estimate" in bar.reason) == (kind == "estimate")
        if kind == "bound":
            assert bool((bar.value <= bar.trivial * (1 + 1e-12)).all())
        if bool(bar.vacuous.any()):
            assert "vacuous at" in bar.reason
    layer, q = press._layers[0], torch.randn(1, 4, 16)
    for args, rule in [((2, layer, q, 0.25), "layer_idx must be an integer in [0, 2)"),
                       ((0, press._layers[1], q, 0.25), "is not this press's layer 0"),
                       ((0, layer, q.half(), 0.25), "float32 or float64"),
                       ((0, layer, q[:, :3], 0.25), "a multiple of the 2 KV heads"),
                       ((0, layer, q.fill_(math.nan), 0.25), "NaN"),
                       ((0, layer, torch.randn(1, 4, 16), math.inf), "scale must be a finite positive number")]:
        with pytest.raises(InputError, match=re.escape(rule)):
            press.certificate(*args)
    with pytest.raises(InputError, match="kind must be one of"):
        press.error_bar(0, kind="exact")
    with pytest.raises(InputError, match="layer must be a kvbounds WeightedLayer"):
        weighted_output("layer", torch.randn(1, 4, 16), 0.25)


def test_a_cache_left_behind_by_its_press_refuses_to_run(arch):
    from transformers import DynamicCache
    model = tiny_model()
    press = StreamingBalanceKVPress(target=48, interval=16, sink=4, window=8)
    first, second = DynamicCache(), DynamicCache()
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=first)
        model(input_ids=ids, past_key_values=second)          # the press now keeps the second cache
        with pytest.raises(InputError, match="used on another cache"):
            model(input_ids=ids[:, :1], past_key_values=first)
