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
    from kvbounds.records import ResultStore
    with ResultStore(tmp_path).lock():
        assert main(["e2e", "--out", str(tmp_path), "--tasks", "ppl", "--methods", "uniform"]) == 2
    assert "another `kvbounds check`" in capsys.readouterr().err
