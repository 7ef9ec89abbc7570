"""The weighted cache inside ``generate`` (issue 22): weights move with the keys (beam search), the logical length
(no prompt re-fed), padding, the wrong attention raises, the attention on SDPA agrees with the contract, and bad
input raises InputError. A tiny random Llama keeps these in seconds; SmolLM2 is not needed. Every test that builds
the model runs on both architectures the harness loads (Llama: SmolLM2; Qwen2: Qwen2.5-Coder-0.5B, with q/k/v
biases and an untied output projection)."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvbounds.algorithms.validation import InputError  # noqa: E402
from kvbounds.e2e._attention import ATTN_IMPLEMENTATION, register, weighted_sdpa  # noqa: E402
from kvbounds.e2e import ModelNotWeighted, WeightedCache, WeightedLayer  # noqa: E402


from tiny_models import ARCHS, tiny_causal_lm  # noqa: E402

ARCH = {"now": "llama"}      # the architecture tiny() builds; the fixture below runs each model test on both


@pytest.fixture(params=ARCHS)
def arch(request):
    ARCH["now"] = request.param
    yield request.param
    ARCH["now"] = "llama"


def tiny(attn=ATTN_IMPLEMENTATION, seed=0, arch=None):
    register()
    torch.manual_seed(seed)
    return tiny_causal_lm(arch or ARCH["now"], attn, vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def prefill(model, ids):
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return [(l.keys, l.values) for l in cache.layers]


def compressed(kv, keep, a=None, b=None):
    """Per layer K, V at the token indices ``keep`` with log-weights a, b (broadcast over batch and heads)."""
    out = []
    for k, v in kv:
        shape = k.shape[:2] + (len(keep),)
        w = lambda x: None if x is None else torch.as_tensor(x, dtype=torch.float32).expand(shape).clone()
        out.append((k[:, :, keep], v[:, :, keep], w(a), w(b)))
    return out


IDS = torch.tensor([[5, 9, 17, 3, 44, 12, 8, 30, 21, 7, 19, 50, 33, 11, 4, 27]])
KEEP = [0, 1, 3, 6, 9, 12, 14, 15]


def test_generate_continues_after_a_compressed_cache_without_refeeding_the_prompt(arch):
    model = tiny()
    n = IDS.shape[1]
    a = np.linspace(-0.5, 0.5, len(KEEP))
    nxt = torch.tensor([[13]])
    cache = WeightedCache.from_compressed(compressed(prefill(model, IDS), KEEP, a, a), logical_length=n)
    fed = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: fed.append(i[0].shape[1]))
    assert cache.get_seq_length() == n
    with torch.no_grad():
        g = model.generate(torch.cat([IDS, nxt], 1), past_key_values=cache, max_new_tokens=3, do_sample=False,
                           output_logits=True, return_dict_in_generate=True)
        hook.remove()
        assert fed == [1, 1, 1], fed                          # only the new token, never the prompt
        direct = WeightedCache.from_compressed(compressed(prefill(model, IDS), KEEP, a, a), logical_length=n)
        lg = model(input_ids=nxt, past_key_values=direct, position_ids=torch.tensor([[n]])).logits[0, -1]
    torch.testing.assert_close(g.logits[0][0], lg, rtol=0, atol=1e-5)


def test_beam_search_moves_the_weights_and_constant_weights_equal_the_unweighted_cache(arch):
    model = tiny()
    n = IDS.shape[1]
    kv = prefill(model, IDS)
    nxt = torch.cat([IDS, torch.tensor([[13]])], 1)

    def run(cache):
        cache.batch_repeat_interleave(2)          # generate expands the inputs to the beams, not a cache given to it
        return model.generate(nxt, past_key_values=cache, max_new_tokens=4, num_beams=2, do_sample=False,
                              output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        # weights 0 plus one extra token at a = b = -inf: the unweighted cache's attention, on the weighted path
        plain = run(WeightedCache.from_compressed(compressed(kv, KEEP), logical_length=n))
        zero = [0.0] * len(KEEP) + [-math.inf]
        const = run(WeightedCache.from_compressed(compressed(kv, KEEP + [2], zero, zero), logical_length=n))
    assert torch.equal(plain.sequences, const.sequences)
    torch.testing.assert_close(plain.sequences_scores, const.sequences_scores, rtol=0, atol=1e-5)
    # reorder / select / repeat keep each row's weights with its keys
    k = torch.arange(2 * 1 * 3 * 1, dtype=torch.float32).view(2, 1, 3, 1)
    a = torch.tensor([[[0.0, -1.0, -2.0]], [[1.0, 2.0, 3.0]]])
    layer = WeightedLayer(k, k.clone(), a, a.clone(), logical_length=10)
    layer.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(layer.log_w_num[0], a[1]) and torch.equal(layer.keys[0], k[1])
    layer.batch_repeat_interleave(2)
    assert layer.log_w_num.shape == (4, 1, 3) and torch.equal(layer.log_w_den[3], a[0])
    layer.batch_select_indices(torch.tensor([2]))
    assert torch.equal(layer.log_w_num[0], a[0]) and layer.get_seq_length() == 10


def test_crop_keeps_weights_aligned_and_refuses_the_compressed_part():
    k = torch.zeros(1, 1, 3, 2)
    a = torch.tensor([[[0.5, -1.0, 0.2]]])
    layer = WeightedLayer(k, k.clone(), a, a.clone(), logical_length=8)
    layer.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert layer.get_seq_length() == 10 and layer.log_w_num.shape == (1, 1, 5)
    layer.crop(9)
    assert layer.keys.shape[2] == 4 and layer.log_w_num.shape == (1, 1, 4) == layer.log_w_den.shape
    with pytest.raises(InputError, match="compressed away"):
        layer.crop(6)


def test_left_padded_batch_equals_each_row_alone(arch):
    model = tiny()
    rows = [IDS[0], IDS[0, 5:]]
    a = [np.linspace(-0.4, 0.6, len(KEEP)), np.linspace(0.3, -0.2, 6)]
    keeps = [KEEP, [0, 2, 4, 7, 9, 10]]
    nxt = torch.tensor([[13], [29]])
    alone = []
    with torch.no_grad():
        for r in range(2):
            ids = rows[r][None]
            c = WeightedCache.from_compressed(compressed(prefill(model, ids), keeps[r], a[r], a[r] - 0.1),
                                              logical_length=ids.shape[1])
            g = model.generate(torch.cat([ids, nxt[r:r + 1]], 1), past_key_values=c, max_new_tokens=3,
                               do_sample=False, output_logits=True, return_dict_in_generate=True)
            alone.append(torch.stack(g.logits, 1)[0])
        # the batch: row 1 left-padded by 5; each row's compressed cache padded to 8 kept tokens with a = b = -inf
        n = IDS.shape[1]
        kv0 = compressed(prefill(model, rows[0][None]), keeps[0], a[0], a[0] - 0.1)
        kv1 = compressed(prefill(model, rows[1][None]), keeps[1], a[1], a[1] - 0.1)
        layers = []
        for (k0, v0, a0, b0), (k1, v1, a1, b1) in zip(kv0, kv1):
            p = lambda x, fill: torch.nn.functional.pad(x, (0, 0, 0, 2) if x.ndim == 4 else (0, 2), value=fill)
            layers.append((torch.cat([k0, p(k1, 0.0)]), torch.cat([v0, p(v1, 0.0)]),
                           torch.cat([a0, p(a1, -math.inf)]), torch.cat([b0, p(b1, -math.inf)])))
        cache = WeightedCache.from_compressed(layers, logical_length=n)
        ids = torch.stack([rows[0], torch.cat([torch.zeros(5, dtype=torch.long), rows[1]])])
        mask = torch.ones(2, n + 1, dtype=torch.long)
        mask[1, :5] = 0
        g = model.generate(torch.cat([ids, nxt], 1), attention_mask=mask, past_key_values=cache, max_new_tokens=3,
                           do_sample=False, output_logits=True, return_dict_in_generate=True)
    batch = torch.stack(g.logits, 1)
    for r in range(2):
        torch.testing.assert_close(batch[r], alone[r], rtol=0, atol=1e-5)


def test_a_model_that_would_ignore_the_weights_raises(arch):
    model = tiny(attn="sdpa")
    kv = prefill(model, IDS)
    a = np.linspace(-1, 1, len(KEEP))
    cache = WeightedCache.from_compressed(compressed(kv, KEEP, a, a), logical_length=IDS.shape[1])
    with pytest.raises(ModelNotWeighted, match="kvbounds_weighted"), torch.no_grad():
        model(input_ids=torch.tensor([[13]]), past_key_values=cache)
    # the same cache without weights is plain attention: sdpa is fine
    cache = WeightedCache.from_compressed(compressed(kv, KEEP), logical_length=IDS.shape[1])
    with torch.no_grad():
        model(input_ids=torch.tensor([[13]]), past_key_values=cache)


def _reference(q, k, v, a, b):
    """Today's (pre-SDPA) weighted attention, in float64: softmax(l + a) V exp(LSE(l + a) - LSE(l + b))."""
    H, Hkv = q.shape[1], k.shape[1]
    rep, L, M = H // Hkv, q.shape[2], k.shape[2]
    K, V, A, B = (x.double().repeat_interleave(rep, 1) for x in (k, v, a, b))
    lg = q.double() @ K.transpose(2, 3) / math.sqrt(q.shape[-1])
    vis = torch.ones(L, M, dtype=torch.bool)
    vis[:, M - L:] = torch.ones(L, L, dtype=torch.bool).tril()
    ln = (lg + A[:, :, None]).masked_fill(~vis, -math.inf)
    ld = (lg + B[:, :, None]).masked_fill(~vis, -math.inf)
    return torch.softmax(ln, -1) @ V * torch.exp(torch.logsumexp(ln, -1, True) - torch.logsumexp(ld, -1, True))


@pytest.mark.parametrize("split", [False, True])
def test_sdpa_weighted_attention_agrees_with_the_reference(split):
    g = torch.Generator().manual_seed(1)
    b, H, Hkv, L, M, d = 2, 6, 2, 3, 43, 8
    q, k, v = (torch.randn(s, generator=g) for s in ((b, H, L, d), (b, Hkv, M, d), (b, Hkv, M, d)))
    a = torch.randn(b, Hkv, M, generator=g)
    bb = a + 0.5 * torch.randn(b, Hkv, M, generator=g) if split else a
    a[..., M - L:], bb[..., M - L:] = 0, 0
    a[0, 0, 3] = -math.inf
    if split:
        bb[1, 1, 7] = -math.inf
    out = weighted_sdpa(q, k, v, a, bb)
    assert float((out.double() - _reference(q, k, v, a, bb)).abs().max()) < 1e-6


def test_weighted_attention_rejects_bad_input():
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    a = torch.zeros(1, 1, 5)
    with pytest.raises(InputError, match="scaling"):
        weighted_sdpa(q, k, v, a, a, scale=float("nan"))
    with pytest.raises(InputError, match="scaling"):
        weighted_sdpa(q, k, v, a, a, scale=float("inf"))
    with pytest.raises(InputError, match="more queries"):
        weighted_sdpa(torch.randn(1, 2, 6, 4), k, v, a, a)
    with pytest.raises(InputError, match="shape"):
        weighted_sdpa(q, k, v, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))
    with pytest.raises(InputError, match="NaN"):
        WeightedLayer(k, v, torch.full((1, 1, 5), float("nan")), a)
    with pytest.raises(InputError, match="-inf for every"):
        WeightedLayer(k, v, a, torch.full((1, 1, 5), -math.inf))
    with pytest.raises(InputError, match="shape"):
        WeightedLayer(k, v, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))


def test_split_values_kept_by_the_layer_follow_updates():
    from kvbounds.e2e._attention import weighted_attention_forward
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(1, 2, 9, 4, generator=g), torch.randn(1, 2, 9, 4, generator=g)
    a = torch.randn(1, 2, 9, generator=g)
    b = a + torch.randn(1, 2, 9, generator=g)
    b[0, 1, 2] = -math.inf
    layer = WeightedLayer(k, v, a, b, logical_length=20)

    class Mod:
        num_key_value_groups = 2
    for step in range(3):                      # the cached [V e^{a-c}, e^{b-c}] is extended, not rebuilt
        kn, vn = torch.randn(1, 2, 1, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g)
        keys, values = layer.update(kn, vn)
        q = torch.randn(1, 4, 1, 4, generator=g)
        out = weighted_attention_forward(Mod(), q, keys, values, None)[0].transpose(1, 2)
        ref = weighted_sdpa(q, keys, values, layer.log_w_num.clone(), layer.log_w_den.clone())
        assert layer._split is not None and float((out - ref).abs().max()) < 1e-6


def test_equal_weights_stay_shared_after_update():
    """Equal numerator and denominator weights are one tensor (one SDPA bias); appending tokens keeps them one."""
    from kvbounds.e2e import WeightedLayer
    K, V = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    lw = torch.full((1, 2, 5), 0.5)
    layer = WeightedLayer(K, V, lw, lw.clone(), logical_length=9)
    assert not layer.split
    layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert layer.weighted and not layer.split and layer.log_w_num.shape == (1, 2, 6)


def test_logical_and_stored_lengths_and_both_cache_apis():
    """The two lengths by name; get_mask_sizes takes the cache positions (transformers 5.2) or the query length
    (later 5.x); crop takes a final logical length or a negative count to remove (later 5.x: only the latter)."""
    k = torch.zeros(1, 1, 3, 2)
    a = torch.tensor([[[0.5, -1.0, 0.2]]])
    layer = WeightedLayer(k, k.clone(), a, a.clone(), logical_length=8)
    layer.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
    assert (layer.logical_length, layer.stored_length, layer.get_seq_length()) == (10, 5, 10)
    assert layer.get_mask_sizes(torch.arange(10, 12)) == layer.get_mask_sizes(2) == (7, 5)
    layer.crop(-1)
    assert (layer.logical_length, layer.stored_length, layer.log_w_num.shape[-1]) == (9, 4, 4)
    with pytest.raises(InputError, match="integer"):
        layer.crop(2.5)
    layer.reset()
    assert layer.logical_length == layer.stored_length == 0 and not layer.weighted


def test_weights_out_of_step_with_the_keys_raise():
    """A layer whose keys were sliced from outside (not by its own crop) would pair keys with the wrong weights."""
    k = torch.zeros(1, 1, 3, 2)
    a = torch.tensor([[[0.5, -1.0, 0.2]]])
    layer = WeightedLayer(k, k.clone(), a, a.clone(), logical_length=8)
    layer.keys, layer.values = layer.keys[:, :, :2], layer.values[:, :, :2]
    with pytest.raises(InputError, match="replaced from outside"):
        layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
