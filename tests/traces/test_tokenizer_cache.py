"""SmolLM2's tokenizer is built from the GGUF file once and then read from its JSON in the cache
(kvbounds.traces.smollm2.load_tokenizer): the cached tokenizer is the built one, a damaged cache file is rebuilt.
The real tokenizer's ids are checked against stored ones in tests/traces/test_real_traces.py. The chat template of the
GGUF file is kept beside it (kvbounds.traces.smollm2.load_chat_template) and reaches the transformers tokenizer."""
import pytest

from kvbounds.traces import smollm2


def _small_tokenizer():
    tk = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers
    tok = tk.Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2, "1": 3}, merges=[("a", "b")], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_end|>"])
    return tok


def test_tokenizer_built_once_then_read_from_the_cache(tmp_path, monkeypatch):
    built = []
    monkeypatch.setenv("KVBOUNDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "_tokenizer_from_gguf", lambda p: built.append(p) or _small_tokenizer())
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not really a gguf file")
    first = smollm2.load_tokenizer(gguf)
    (saved,) = (tmp_path / "cache" / "models").iterdir()
    assert saved.name.startswith("smollm2-") and "-tokenizer-v1-tokenizers" in saved.name and built == [gguf]
    second = smollm2.load_tokenizer(gguf)
    assert built == [gguf] and second.to_str() == first.to_str()
    assert second.encode("ab1<|im_end|>").ids == first.encode("ab1<|im_end|>").ids == [2, 3, 4]
    saved.write_text("{ damaged")
    assert smollm2.load_tokenizer(gguf).to_str() == first.to_str() and built == [gguf, gguf]
    assert smollm2.load_tokenizer(gguf).to_str() == first.to_str() and len(built) == 2


def test_chat_template_kept_from_the_gguf_file(tmp_path, monkeypatch):
    """SmolLM2-Instruct's ChatML template (GGUF metadata ``tokenizer.chat_template``) is read once, cached, and put
    on the transformers tokenizer the pipelines use: a user turn comes out as the model was trained on it."""
    pytest.importorskip("transformers")
    try:
        path = smollm2.model_file()
    except smollm2.ModelUnavailable as e:
        pytest.skip(str(e))
    from types import SimpleNamespace
    from kvbounds.e2e import LoadedModel
    monkeypatch.setenv("KVBOUNDS_CACHE", str(tmp_path / "cache"))
    tokenizer = smollm2.load_tokenizer(path)                   # built from the GGUF file: its template saved too
    (saved,) = (tmp_path / "cache" / "models").glob("*-chat-template.json")
    import gguf
    with monkeypatch.context() as m:
        m.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("the cached template is read again"))
        template = smollm2.load_chat_template(path)
    assert "<|im_start|>" in template
    reader = SimpleNamespace(tokenizer=tokenizer, chat_template=template)
    lm = LoadedModel(model=None, encode=None, name="SmolLM2", reader=reader)
    text = lm.hf_tokenizer().apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                 add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert lm.hf_tokenizer(chat_template=False).chat_template is None
    saved.write_text("{ damaged")                               # read from the GGUF file again (a stand-in here)
    field = SimpleNamespace(contents=lambda: "{{ messages }}")
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: SimpleNamespace(fields={"tokenizer.chat_template": field}))
    assert smollm2.load_chat_template(path) == "{{ messages }}" and "messages" in saved.read_text()
