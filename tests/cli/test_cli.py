import json

from kvbounds.cli import main


def test_list_check_report(tmp_path, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(cid in out for cid in ("SBW.balance", "SG.reservoir", "FD.covariance", "LB.index"))
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    assert (tmp_path / "results.jsonl").exists()
    first = (tmp_path / "results.jsonl").read_text().splitlines()
    assert all({"claim", "params", "seed", "backend", "measured", "bound", "holds"} <= json.loads(l).keys() for l in first)
    main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"])
    assert (tmp_path / "results.jsonl").read_text().splitlines() == first      # resumed: nothing recomputed
    assert main(["report", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MR.memory" in out and (tmp_path / "report.html").exists()


def test_unknown_claim_and_backend(tmp_path, capsys):
    assert main(["check", "NOPE.x", "--out", str(tmp_path)]) == 2
    assert "unknown claim" in capsys.readouterr().err
    assert main(["check", "MR.memory", "--backend", "tpu", "--out", str(tmp_path)]) == 2


def test_version(capsys):
    import pytest
    from kvbounds import __version__
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"kvbounds {__version__}"


def test_list_has_header_and_statements(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "CLAIM" in out and "KIND" in out and "SOURCE" in out
    assert "Frequent Directions" in out and "arXiv" not in out.splitlines()[0]
    assert main(["list", "--brief"]) == 0
    assert "Frequent Directions" not in capsys.readouterr().out


def test_show_and_did_you_mean(tmp_path, capsys):
    assert main(["show", "mr.MEMORY", "--out", str(tmp_path)]) == 0      # case-insensitive
    out = capsys.readouterr().out
    assert out.startswith("MR.memory") and "BalanceKV-NeurIPS Thm 3.4" in out and "2502.07861" in out
    assert "theory/balancekv.py: merge_reduce_memory_bound" in out and "proofs_checks/mr_memory.py" in out
    assert "verdict: not run" in out and "trials:  smoke 3 · quick 11" in out and "gpu 0" in out
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["show", "MR.memory", "--out", str(tmp_path)]) == 0
    assert "records in" in capsys.readouterr().out
    assert main(["show", "MR.memroy"]) == 2
    assert "did you mean MR.memory" in capsys.readouterr().err
    assert main(["report", "MR.memroy", "--out", str(tmp_path)]) == 2
    assert "did you mean MR.memory" in capsys.readouterr().err
    assert main(["report", "mr.memory", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "MR.memory" in out and "SG.attention" not in out


def test_report_on_missing_or_empty_dir_is_an_error(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path)]) == 2
    assert "no records" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


# -- issue 24: the CLI refuses clearly (one line, rc != 0, no traceback) ------------------------------------------

def test_report_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "results.jsonl"
    f.write_text("")
    assert main(["report", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "does not exist" not in err


def test_report_on_unwritable_dir_is_one_line(tmp_path, capsys, monkeypatch):
    import errno
    assert main(["check", "MR.memory", "--profile", "smoke", "--out", str(tmp_path), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    from kvbounds.core import _output_files as output_files
    for code in (errno.EROFS, errno.ENOSPC):      # read-only and full: root can write anywhere, so the write fails
        def refuse(*a, _code=code, dir=None, **kw):   # every output file starts as a temporary file in its directory
            raise OSError(_code, __import__("os").strerror(_code), str(dir))
        monkeypatch.setattr(output_files, "mkstemp", refuse)
        assert main(["report", "--out", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("kvbounds: error: cannot write the report") and "Traceback" not in err
        assert __import__("os").strerror(code) in err and len(err.strip().splitlines()) == 1


def test_unavailable_backend_is_refused_before_starting(tmp_path, capsys, monkeypatch):
    import kvbounds.algorithms.arrays as be
    for name in ("cupy", "torch:cuda"):
        why = be.why_unavailable(name)
        if why is None:
            continue                                  # runs here: nothing to refuse
        assert main(["check", "MR.memory", "--backend", name, "--out", str(tmp_path / "x"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"--backend {name} cannot run" in err and why in err
        assert not (tmp_path / "x").exists()          # no trial ran, no error records written


def test_list_into_a_closed_pipe_is_quiet():
    import subprocess
    import sys
    r = subprocess.run(f"{sys.executable} -m kvbounds list | head -c 10", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert "BrokenPipeError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
