"""kvbounds' presses in kvpress (issue 22): ``with press(model): model.generate(...)`` gives the harness path's
logits (same compressor, same seed), kvpress's pipeline runs each press and answers what the harness path
answers, and a model without the weighted attention raises. Skipped with the reason when kvpress is missing."""
from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("kvpress", reason="kvpress not installed (pip install 'kvbounds[kvpress]'): press tests skipped")

import kvbounds.presses._kvpress as P  # noqa: E402
from kvbounds.e2e import _harness as harness  # noqa: E402
from kvbounds.e2e import _methods as M  # noqa: E402
from kvbounds.e2e import ModelNotWeighted, WeightedCache  # noqa: E402

SINK = WINDOW = 16
SEED = 3


def every_press():
    """Each press name; kernel thinning's skipped with the reason without goodpoints (the extra kvbounds[kt])."""
    from kvbounds.algorithms.kernel_thinning import goodpoints_missing
    why = goodpoints_missing()
    return [pytest.param(n, marks=pytest.mark.skipif(why is not None, reason=str(why))) if n == "kernel_thinning"
            else n for n in sorted(P.PRESSES)]


def _ids(lm, n):
    from kvbounds.traces.real import default_text
    return lm.encode(default_text())[:n]


def harness_cache(lm, ids, name, ratio):
    """The harness path: exact prefill, the method's compressor on every layer (``rng`` seeded as the press
    seeds each row), the compressed layers in a WeightedCache standing for all len(ids) tokens."""
    state = harness.prefill(lm, ids, capture_inputs=name == "h2o")
    rng = np.random.default_rng(SEED)
    if name == "h2o":
        comp = []
        for l, layer in enumerate(lm.model.model.layers):
            kw = state.attn_kwargs[l]
            Q = P._group_queries(layer.self_attn, kw["hidden_states"], kw)[0]
            comp.append(P.H2OPress(compression_ratio=ratio, sink=SINK, window=WINDOW).compress_row(
                None, state.keys[l][0].float(), state.values[l][0].float(), np.random.default_rng(SEED), Q))
    else:
        comp = M.compress_all(name, lm, state, 1 - ratio, rng, sink=SINK, window=WINDOW, where="device")
    return WeightedCache.from_compressed(harness._to_layers(lm, comp), logical_length=len(ids))


def check_generate(lm, name, n, ratio=0.5, k=4):
    model = lm.model
    ids = torch.as_tensor(_ids(lm, n))[None]
    press = P.PRESSES[name](compression_ratio=ratio, sink=SINK, window=WINDOW, seed=SEED)
    gen = dict(max_new_tokens=k, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad():
        with press(model):
            g = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
        first = g.sequences[:, n:n + 1]
        cache = harness_cache(lm, ids[0].numpy(), name, ratio)
        h = model.generate(torch.cat([ids, first], 1), past_key_values=cache,
                           attention_mask=torch.ones(1, n + 1, dtype=torch.long), **dict(gen, max_new_tokens=k - 1))
    assert torch.equal(g.sequences[:, n:], h.sequences[:, n:]), name
    diff = max(float((a - b).abs().max()) for a, b in zip(g.logits[1:], h.logits))
    assert diff <= 1e-5, (name, diff)


@pytest.mark.parametrize("name", ["uniform", "subgen"])
def test_press_generate_matches_the_harness_path(lm, name):
    check_generate(lm, name, 112)


@pytest.mark.slow
@pytest.mark.parametrize("name", every_press())
def test_every_press_matches_the_harness_path_at_512(lm, name):
    check_generate(lm, name, 512)


def check_pipeline(lm, name, n_chars, k=3):
    from transformers import pipeline
    from kvbounds.traces.real import default_text
    tok = lm.hf_tokenizer(chat_template=False)     # the pipeline's plain format, rebuilt by hand below
    pipe = pipeline("kv-press-text-generation", model=lm.model, tokenizer=tok)
    context, question = default_text()[:n_chars], "What is this text about?"
    press = P.PRESSES[name](compression_ratio=0.5, sink=SINK, window=WINDOW, seed=SEED)
    answer = pipe(context, question=question, press=press, max_new_tokens=k)["answer"]
    # the harness path on the same tokens: compressed context, then the question and greedy decoding
    ctx = tok.encode(tok.bos_token + context, add_special_tokens=False)
    q = torch.as_tensor(tok.encode(question + "\n", add_special_tokens=False))[None]
    cache = harness_cache(lm, np.asarray(ctx), name, 0.5)
    out, pos = [], torch.arange(len(ctx), len(ctx) + q.shape[1])[None]
    with torch.no_grad():
        for _ in range(k):
            logits = lm.model(input_ids=q, past_key_values=cache, position_ids=pos).logits[0, -1]
            out.append(int(logits.argmax()))
            q, pos = torch.tensor([[out[-1]]]), pos[:, -1:] + 1
    assert answer == tok.decode(out, skip_special_tokens=True), name


def test_pipeline_runs_a_press(lm):
    check_pipeline(lm, "subgen", 400)


STREAMING = {"streaming_balancekv": "StreamingBalanceKVPress", "streaming_subgen": "StreamingSubGenPress"}


def make_press(name):
    """A press by name: kvbounds.presses._kvpress's, or a streaming press (target 48, interval 16: the tiny model's
    answers
    run through several reductions)."""
    if name in STREAMING:
        import kvbounds.presses._streaming as S
        return getattr(S, STREAMING[name])(target=48, interval=16, sink=4, window=8, seed=SEED)
    return P.PRESSES[name](compression_ratio=0.5, sink=SINK, window=WINDOW, seed=SEED)


def pipeline_presses():
    return every_press() + sorted(STREAMING)


def tiny_with_tokenizer(tok):
    """A seeded random 2-layer Llama over SmolLM2's vocabulary, on the weighted attention: kvpress's pipeline with
    a real tokenizer at a fraction of SmolLM2's cost (its answers are noise, which is all an equality needs)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    P.use_weighted_attention(model)
    return model


@pytest.fixture(scope="module")
def tiny_pipe(lm):
    from transformers import pipeline
    tok = lm.hf_tokenizer()
    return P.pipeline(tiny_with_tokenizer(tok), tok)


def several_questions(pipe, name, n_chars=400, k=32):
    """kvpress's multi-question path: the context is compressed once and each answer cut off after it (a weighted
    layer cut by its own crop at the logical length; a streaming press's cache returned to the state it had when
    the press was left); each answer equals the one asked alone, at k generated tokens."""
    from kvbounds.traces.real import default_text
    context = default_text()[:n_chars]
    questions = ["What is this text about?", "Name one keyword.", "Summarise it in one line."]
    both = pipe(context, questions=questions, press=make_press(name), max_new_tokens=k)["answers"]
    alone = [pipe(context, question=q, press=make_press(name), max_new_tokens=k)["answer"] for q in questions]
    assert both == alone, name


@pytest.mark.parametrize("name", pipeline_presses())
def test_pipeline_answers_several_questions_as_if_asked_alone(tiny_pipe, name):
    several_questions(tiny_pipe, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", pipeline_presses())
def test_pipeline_answers_several_questions_on_smollm2(lm, name):
    from transformers import pipeline
    several_questions(P.pipeline(lm.model, lm.hf_tokenizer()), name,
                      n_chars=1200, k=48)


@pytest.mark.parametrize("name", sorted(STREAMING))
def test_streaming_press_keeps_its_bound_while_the_pipeline_answers(tiny_pipe, name):
    """The context is compressed inside the press; the question and a 150-token answer are generated outside it
    (kvpress's pipeline), and the cache keeps reducing: every attention call after the context's own forward pass
    sees at most target + interval tokens per layer."""
    from transformers import DynamicCache
    from kvbounds.traces.real import default_text
    press, cache, seen = make_press(name), DynamicCache(), []
    model = tiny_pipe.model
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, a, kw, out: seen.append((kw["hidden_states"].shape[1], kw["past_key_values"].layers[m.layer_idx]
                                           .keys.shape[-2])), with_kwargs=True) for layer in model.model.layers]
    try:
        tiny_pipe(default_text()[:800], question="What is this text about?", press=press, max_new_tokens=150,
                  cache=cache)
    finally:
        for h in hooks:
            h.remove()
    context_pass = seen[0][0]
    after = [stored for L, stored in seen if L < context_pass]
    assert len(after) >= 2 * 150 and max(after) <= press.target + press.interval, max(after)
    assert max(l.stored_length for l in cache.layers) <= press.target + press.interval
    drops = sum(b < a for a, b in zip(after[::2], after[2::2]))         # layer 0's stored size falling: a reduction
    assert drops >= 150 // press.interval, drops


def test_beam_search_with_a_streaming_press_is_refused():
    from test_weighted_cache import tiny
    from kvbounds.algorithms.validation import InputError
    model = tiny()
    press = make_press("streaming_balancekv")
    ids = torch.randint(3, 64, (1, 70), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match="beam search"), torch.no_grad(), press(model):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, num_beams=2, do_sample=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", every_press())
def test_pipeline_runs_every_press(lm, name):
    check_pipeline(lm, name, 1200)


def test_press_on_a_model_without_the_weighted_attention_raises(lm):
    from transformers import LlamaForCausalLM
    sdpa = LlamaForCausalLM.__new__(LlamaForCausalLM)      # a stand-in with the config's attention only
    sdpa.config = type("C", (), {"_attn_implementation": "sdpa"})()
    with pytest.raises(ModelNotWeighted, match="kvbounds_weighted"):
        with P.UniformPress(compression_ratio=0.5)(sdpa):
            pass


def test_press_options_are_validated():
    from kvbounds.algorithms.validation import InputError
    for bad in (dict(compression_ratio=1.0), dict(compression_ratio=-0.1), dict(sink=-1), dict(window=1.5)):
        with pytest.raises(InputError):
            P.UniformPress(**bad)
    assert P.KCenterPress(cluster_sized=True).method == "kcenter_sized"


IMPORT_ORDER = r"""
import kvpress                                   # first: kvpress patches the attention functions present now
from kvpress import AdaKVPress, KnormPress
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from kvbounds.e2e._attention import ATTN_IMPLEMENTATION, register   # registered after kvpress's patching
register()
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ids = torch.randint(3, 64, (1, 40), generator=torch.Generator().manual_seed(1))
def logits(attn, press):
    torch.manual_seed(0)
    cfg._attn_implementation = attn
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad(), (press(model) if press else torch.no_grad()):
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                           output_logits=True, return_dict_in_generate=True)
    return torch.stack(g.logits[1:])
ours = logits(ATTN_IMPLEMENTATION, AdaKVPress(KnormPress(0.6)))
eager = logits("sdpa", AdaKVPress(KnormPress(0.6)))      # kvpress's own patched sdpa attention
plain = logits(ATTN_IMPLEMENTATION, None)
print(float((ours - eager).abs().max()), float((ours - plain).abs().max()))
"""


def test_adakv_compresses_when_kvpress_is_imported_before_kvbounds():
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", IMPORT_ORDER], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    vs_eager, vs_plain = map(float, res.stdout.split()[-2:])
    assert vs_eager < 1e-5 and vs_plain > 1e-3, res.stdout          # AdaKV's evictions applied, as kvpress applies them


@pytest.mark.parametrize("name", ["uniform", "subgen"])
def test_press_on_a_left_padded_batch_equals_each_row_alone(name):
    from test_weighted_cache import IDS, tiny
    model = tiny()
    rows = [IDS[0], IDS[0, 5:]]
    press = P.PRESSES[name](compression_ratio=0.5, sink=1, window=1, seed=1)   # the 11-token row leaves SubGen its 3d + 2 floats
    gen = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.no_grad(), press(model):
        alone = [torch.stack(model.generate(r[None], attention_mask=torch.ones(1, len(r), dtype=torch.long),
                                            **gen).logits, 1)[0] for r in rows]
        ids = torch.stack([rows[0], torch.cat([torch.zeros(5, dtype=torch.long), rows[1]])])
        mask = (torch.arange(16)[None] >= torch.tensor([[0], [5]])).long()
        batch = torch.stack(model.generate(ids, attention_mask=mask, **gen).logits, 1)
    for r in range(2):
        torch.testing.assert_close(batch[r], alone[r], rtol=0, atol=1e-5)


def test_answer_cut_names_a_kvpress_without_the_method_it_wraps(monkeypatch):
    """kvbounds.e2e._kvpress_answers wraps one private method of kvpress's pipeline; a kvpress without it (outside the
    extra's range) is a clear error, not a pipeline that silently keeps the first answer in the cache."""
    from kvpress.pipeline import KVPressTextGenerationPipeline
    from kvbounds.e2e import _kvpress_answers as kvpress_answers
    monkeypatch.delattr(KVPressTextGenerationPipeline, "_remove_answer_from_cache")
    with pytest.raises(RuntimeError, match="_remove_answer_from_cache"):
        with kvpress_answers.weighted_answers():
            pass


def test_the_pipeline_fix_is_scoped_never_a_side_effect_of_an_import(tiny_pipe):
    """Importing kvbounds' presses leaves kvpress's pipeline as it was; kvpress's own pipeline asked several
    questions over a kvbounds press is refused in one line naming the two ways; inside weighted_answers() it
    answers as the subclass does, and kvpress's method is back on exit (nested blocks too)."""
    import subprocess
    from kvpress.pipeline import KVPressTextGenerationPipeline as K
    code = ("from kvpress.pipeline import KVPressTextGenerationPipeline as K; f = K._remove_answer_from_cache; "
            "import kvbounds.presses._kvpress, kvbounds.presses._streaming.presses; "
            "assert K._remove_answer_from_cache is f and '_kvbounds' not in str(vars(K))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    own = K.__dict__["_remove_answer_from_cache"]
    plain = K(model=tiny_pipe.model, tokenizer=tiny_pipe.tokenizer)
    context, questions = "A short context about nothing in particular. " * 8, ["What is it?", "Say one word."]
    with pytest.raises(RuntimeError, match="kvbounds.presses.pipeline"):
        plain(context, questions=questions, press=make_press("uniform"), max_new_tokens=4)
    want = tiny_pipe(context, questions=questions, press=make_press("uniform"), max_new_tokens=4)["answers"]
    with P.weighted_answers():
        with P.weighted_answers():
            pass
        assert K.__dict__["_remove_answer_from_cache"] is not own
        got = plain(context, questions=questions, press=make_press("uniform"), max_new_tokens=4)["answers"]
    assert got == want and K.__dict__["_remove_answer_from_cache"] is own
    one = plain(context, question=questions[0], press=make_press("uniform"), max_new_tokens=4)["answer"]
    assert one == want[0]
