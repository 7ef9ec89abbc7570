"""`kvbounds e2e` refuses bad input with one clear line and exit 2 before any work (issue 21), and writes under
the output directory's lock."""
import pytest

from kvbounds.cli import main


@pytest.mark.parametrize("argv, says", [
    (["--budgets", "0"], "(0, 1]"),
    (["--budgets", "1.5"], "(0, 1]"),
    (["--budgets", "-0.2"], "(0, 1]"),
    (["--n", "0"], "--n must be a positive integer"),
    (["--instances", "0"], "--instances must be a positive integer"),
    (["--n", "64", "--window", "32"], "too small for sink + window"),
    (["--n", "512", "--budgets", "0.1"], "sink"),
    (["--methods", "uniform", "nonsense"], "unknown 'nonsense'"),
    (["--model", "/no/such/model/dir"], "does not exist"),
    (["--model", "nobody/no-such-model-xyz"], "does not exist"),
    (["--device", "tpu"], "--device must be"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, capsys, argv, says):
    out = tmp_path / "res"
    assert main(["e2e", "--out", str(out)] + argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not out.exists()                  # nothing written, no model loaded


def test_cuda_without_cuda_is_refused(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["e2e", "--device", "cuda", "--out", str(tmp_path / "r")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_e2e_refuses_a_locked_directory(tmp_path, capsys):
    from kvbounds.core import ResultStore
    with ResultStore(tmp_path).lock():
        assert main(["e2e", "--out", str(tmp_path), "--tasks", "ppl", "--methods", "uniform"]) == 2
    assert "another `kvbounds check`" in capsys.readouterr().err


# --model paths that are no model, --n beyond the model's context (read from its configuration), repeated entries

def test_n_beyond_the_models_context_is_refused_before_any_work(tmp_path, capsys):
    """--n 9000 ran 92 s on SmolLM2 (context 8192), 10^12 loaded the model and ended in a traceback."""
    pytest.importorskip("gguf")
    from kvbounds.traces.real import available
    if available("smollm2"):
        pytest.skip(available("smollm2"))
    for n in ("9000", "8129", str(10**12)):
        out = tmp_path / f"res{n}"
        assert main(["e2e", "--out", str(out), "--n", n]) == 2
        err = capsys.readouterr().err
        assert f"--n {n} is beyond the model's context of 8192 tokens" in err and "GGUF metadata" in err, err
        assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_path_that_is_no_model_is_refused_with_the_reason(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "file.bin").write_bytes(b"x")
    cases = [(tmp_path / "file.bin", "is a file, not a model"), (folder, "has no config.json")]
    for path, says in cases + [(folder, "has no weights"), (folder, "not a model transformers can read")]:
        if says == "has no weights":
            (folder / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 128}')
        if says.startswith("not a model transformers"):
            (folder / "config.json").write_text('{"model_type": "no-such-architecture"}')
            (folder / "model.safetensors").write_bytes(b"")
        assert main(["e2e", "--out", str(tmp_path / "res"), "--model", str(path)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (folder / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 128}')
    assert main(["e2e", "--out", str(tmp_path / "res"), "--model", str(folder), "--n", "100",
                 "--window", "8"]) == 2
    assert "context of 128 tokens (max_position_embeddings in its config.json)" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


def test_repeated_methods_and_budgets_run_once(capsys):
    import argparse
    from kvbounds.cli._e2e import dedupe
    args = argparse.Namespace(methods=["uniform", "balancekv", "uniform", "uniform"], budgets=[0.25, 0.5, 0.25])
    notes = dedupe(args)
    assert args.methods == ["uniform", "balancekv"] and args.budgets == [0.25, 0.5]
    assert any("--methods: uniform given more than once" in n for n in notes)
    assert any("--budgets: 0.25 given more than once" in n for n in notes)
