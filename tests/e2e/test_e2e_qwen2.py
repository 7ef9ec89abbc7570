"""The end-to-end harness on a Qwen2 model (Qwen2.5-Coder-0.5B's architecture: q/k/v biases, an untied output
projection, GQA), without a download: a tiny random Qwen2 in the default tier; the real model's tests are slow."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvbounds.e2e import _harness as harness, _methods as M  # noqa: E402
from kvbounds.e2e._attention import ATTN_IMPLEMENTATION, register  # noqa: E402
from kvbounds.e2e._model import LoadedModel  # noqa: E402
from kvbounds.e2e._tasks import Task  # noqa: E402
from tiny_models import tiny_causal_lm  # noqa: E402

OURS = ("uniform", "streaming_llm", "kcenter", "balancekv", "balancekv_released", "subgen", "subspace", "h2o")
PRESSES = ("kvpress:snapkv", "kvpress:knorm", "kvpress:tova", "kvpress:expected_attention")


@pytest.fixture(scope="module")
def qwen2():
    register()
    torch.manual_seed(0)
    model = tiny_causal_lm("qwen2", ATTN_IMPLEMENTATION, vocab_size=64, hidden_size=64, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=1024)
    assert model.model.layers[0].self_attn.q_proj.bias is not None and not model.config.tie_word_embeddings
    return LoadedModel(model=model, encode=lambda s: np.frombuffer(s.encode(), np.uint8).astype(np.int64) % 64,
                       name="tiny Qwen2")


def task(n=512, seed=0):
    ids = np.random.default_rng(seed).integers(3, 64, n + 8)
    return Task("passkey", ids[:n], ids[n:n + 7], ids[n + 1:n + 8])


@pytest.mark.parametrize("budget", [0.35, 0.75])
def test_every_method_runs_on_qwen2_at_equal_memory(qwen2, budget):
    if M.kvpress_available():
        pytest.skip("kvpress is not installed")
    rows = harness.run_cell(qwen2, task(), OURS + PRESSES, [budget], sink=16, window=16)
    errors = {r["method"]: r["error"] for r in rows if r["error"]}
    # SubGen near the whole cache stores more entries than tokens: a row saying so, not a failure
    assert not {m: e for m, e in errors.items() if not (m == "subgen" and e.startswith("not attainable"))}
    exact = rows[0]
    for r in rows[1:]:
        if r["error"]:
            continue
        assert abs(r["memory_floats"] / (budget * exact["memory_floats"]) - 1) <= M.MEMORY_TOLERANCE, r["method"]
        assert np.all(np.isfinite(r["ll"]))


def test_exact_row_is_the_model_itself(qwen2):
    t = task(seed=1)
    (exact,) = harness.run_cell(qwen2, t, [], [0.5])
    x = torch.as_tensor(np.concatenate([t.context, t.tail]))[None]
    with torch.no_grad():
        lp = torch.log_softmax(qwen2.model(input_ids=x).logits[0, -len(t.targets):].double(), -1)
    want = lp.gather(1, torch.as_tensor(t.targets)[:, None])[:, 0].numpy()
    # the same float32 model, one pass against a prefill then the tail: rounding of float32 sums in another order
    np.testing.assert_allclose(exact["ll"], want, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_real_qwen_loads_verified_and_retrieves_a_line():
    from kvbounds.e2e._model import load_model
    from kvbounds.e2e._tasks import lines_task
    from kvbounds.traces import qwen
    if qwen.available():
        pytest.skip(qwen.available())
    lm = load_model(qwen.NAME)
    assert lm.n_layers == 24 and lm.n_kv_heads == 2 and lm.head_dim == 64
    (exact,) = harness.run_cell(lm, lines_task(lm, 512, 2000, n_lines=8), [], [0.5])
    assert all(exact["hit"])
